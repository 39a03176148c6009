"""What the parts agree on: the task request (DESIGN.md §3), session states and stages, engine addresses and the
callback targets a batch may name. Parsing and validation only; nothing here reaches a database or the network."""

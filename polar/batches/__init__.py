"""Use cases over a whole batch that reach past the lifecycle into stages and training: cancelling a batch."""

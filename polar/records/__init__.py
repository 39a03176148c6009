"""What Polar keeps about its data: who did what through the API (``audit``), what produced a batch's results
(``provenance``), and how long captured data is kept (``retention``, ``polar gc``)."""

"""The engine fleet: the engines' HTTP client and pool (health, load, pins), the fleet as the API shows it, and the
pause and weight-sync state the trainer sets (``control``)."""

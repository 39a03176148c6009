"""The NeMo Gym agent server (``polar gym-agent``): an aiohttp app over ``polar.gym``. See ``app``."""

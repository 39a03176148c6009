"""Small agents that ship with Polar, used as demo harnesses (they call the proxy with official SDKs)."""

"""Errors the CLI turns into one clear line and a non-zero exit."""


class ConfigError(ValueError):
    """A bad kernel, mode, dtype, shape or combination of them."""

"""Python config files (big_vision style): each defines ``get_config() -> ConfigDict``."""

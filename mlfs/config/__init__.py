"""One TOML file configures a mount; with none, the embedded default serves.

The face of the configuration: the settings (settings.py: one dataclass per table and
RANGES), reading and checking a file (parse.py) and its other forms for people and
editors (forms.py).
"""

from .forms import as_dict, as_toml, json_schema
from .parse import ConfigError, check_host, default_text, load_config, parse_config
from .settings import RANGES, SECTIONS, Config, ModeConfig, MountConfig

__all__ = [
    "RANGES", "SECTIONS", "Config", "ConfigError", "ModeConfig", "MountConfig", "as_dict",
    "as_toml", "check_host", "default_text", "json_schema", "load_config", "parse_config",
]

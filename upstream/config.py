"""The upstream server's settings (`upstream serve|background|stop`, `pack train|plan|
build`): where its data lives, the model it serves and the key it asks for. config.toml:
the top-level keys below, or an ``[upstream]`` table of them for this side alone (see
shared.settings)."""

from typing import ClassVar

from meancache.shared.settings import SettingsBase, UpstreamChoice


class UpstreamSettings(UpstreamChoice, SettingsBase):
    file_table: ClassVar[str | None] = "upstream"

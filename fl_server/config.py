"""The FL server's settings (`fl server|run|simulate|sign-app`): where its state lives and
the encoder its rounds train. config.toml: the top-level keys below, or an ``[fl_server]``
table of them for this side alone (see shared.settings)."""

from pathlib import Path
from typing import ClassVar

from meancache.shared.settings import EncoderChoice, SettingsBase


class FlServerSettings(EncoderChoice, SettingsBase):
    file_table: ClassVar[str | None] = "fl_server"

    @property
    def state_dir(self) -> Path:
        """The SuperLink's state, logs and the server's checkpoints."""
        return self.data_dir / "fl-server"

    @property
    def checkpoint_dir(self) -> Path:
        """The signed global models the endpoint serves."""
        return self.state_dir / "checkpoints"

    @property
    def app_signature_dir(self) -> Path:
        """The operator's app signatures, handed to SuperNodes with the app."""
        return self.state_dir / "app-signatures"

"""The user's data dir is the user's alone: the cache (DiskCache unpickles what it reads),
conversations, exports, global models and logs hold their questions and answers.

Everything meancache creates is owner-only (0700 directories, 0600 files: a umask of 077
while a command runs), and a data dir that another user owns or can write to is refused,
since whoever can write there can make the cache unpickle code of theirs.
"""

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from meancache.client.errors import ConfigError

OWNER_ONLY = 0o077  # the umask: no group or other bits on anything created


@contextmanager
def owner_only_files() -> Iterator[None]:
    """Within the block, files and directories this process creates are owner-only."""
    previous = os.umask(OWNER_ONLY)
    try:
        yield
    finally:
        os.umask(previous)


def check_data_dir(data_dir: Path) -> None:
    """Create ``data_dir`` owner-only, or refuse (ConfigError) an existing one that is not
    this user's or that others may write to."""
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = data_dir.stat()
    except OSError as exc:
        raise ConfigError(f"cannot create the data dir {data_dir}: {exc.strerror}; pass "
                          "--data-dir with a directory of your own") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"the data dir {data_dir} is not a directory; pass --data-dir with "
                          "a directory of your own")
    if info.st_uid != os.getuid():
        raise ConfigError(f"the data dir {data_dir} belongs to another user (uid "
                          f"{info.st_uid}): meancache would load data they can change; pass "
                          "--data-dir with a directory of your own")
    if info.st_mode & 0o022:
        raise ConfigError(f"the data dir {data_dir} can be written by other users (mode "
                          f"{stat.S_IMODE(info.st_mode):o}): meancache would load data they "
                          f"can change; run `chmod 700 {data_dir}` or pass --data-dir with "
                          "a directory of your own")

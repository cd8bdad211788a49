"""Who can reach a server the harness starts (scripted_runtime/user_side/server.py,
hooks/sglang_compat.py): the control socket's address and the HTTP key's
server arguments (pure, no SGLang process)."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from scripted_runtime.errors import ServerStartError
from scripted_runtime.hooks import sglang_compat
from scripted_runtime.user_side import server


def test_the_control_socket_lives_in_a_directory_only_its_user_can_enter(tmp_path):
    private = Path(tempfile.mkdtemp(dir=tmp_path))  # what ScriptedServer makes: mode 0700
    assert server.control_address(private) == f"ipc://{private}/control"
    os.chmod(private, 0o755)
    with pytest.raises(ServerStartError, match="mode 755: other users could reach the control socket"):
        server.control_address(private)


def test_a_socket_path_too_long_for_a_unix_socket_names_tmpdir(tmp_path):
    deep = tmp_path / ("d" * 120)
    deep.mkdir(mode=0o700)
    with pytest.raises(ServerStartError, match="longer than a unix socket allows .*set TMPDIR"):
        server.control_address(deep)


def test_one_key_is_both_sglang_keys_where_the_release_has_them():
    @dataclass
    class Now:  # 0.5.23: both
        api_key: Optional[str] = None
        admin_api_key: Optional[str] = None

    @dataclass
    class Older:  # a release without the admin level
        api_key: Optional[str] = None

    assert sglang_compat.api_key_args(Now, "s") == {"api_key": "s", "admin_api_key": "s"}
    assert sglang_compat.api_key_args(Older, "s") == {"api_key": "s"}

"""The local launcher's output pump: whole lines, prefixed, a killed host's last line ended."""

import io

from locojax.launch.local import _Output, _pump


def _pumped(data: bytes, prefix: str = "[host 1] ") -> str:
    dst = io.StringIO()
    _pump(io.BytesIO(data), dst, prefix, 1, _Output())
    return dst.getvalue()


def test_whole_lines_come_through_prefixed():
    assert _pumped(b"a\nb\n") == "[host 1] a\n[host 1] b\n"


def test_a_killed_hosts_unfinished_line_is_ended():
    # A host killed between print's text and its newline (unbuffered stderr) leaves "DYING";
    # the launcher's own line must not be glued to it.
    assert _pumped(b"a\nDYING") == "[host 1] a\n[host 1] DYING\n"

"""``tensoropt app`` (the dashboard of ``app/``; tests live in tests/dashboard so that the name
``app`` stays the dashboard package): bad ports are refused before the server starts."""

import socket

from conftest import run_cli as run


def test_a_port_in_use_is_refused_with_the_fix(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, out, err = run(capsys, "app", "--port", str(port))
    assert code == 2 and f"127.0.0.1:{port}" in err and "--port" in err and "Traceback" not in err


def test_a_port_out_of_range_is_refused(capsys):
    code, out, err = run(capsys, "app", "--port", "70000")
    assert code == 2 and "between 1 and 65535" in err

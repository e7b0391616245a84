"""A request's fields declare their options once: every surface asks for the same thing the same way.

The CLI's options are built from :class:`tensoropt.request.Request`'s fields, and the dashboard's
controls start at the same defaults; these tests read the surfaces (a command's parsed options, its
``--help``, the dashboard's request) and compare them with values worked by hand.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from tensoropt.cli import build_parser
from tensoropt.cli._common import request_fields, workflow_request
from tensoropt.dashboard.requests import request_from_controls
from tensoropt.errors import TensorOptError
from tensoropt.request import Request, default_of, option_of


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_a_command_line_becomes_the_request_written_by_hand() -> None:
    args = _parse("frontier", "zoo:gpt2?layers=2", "--cluster", "preset:v100-8-nvlink", "--batch", "4",
                  "--devices", "gpu0, gpu1", "--budget", "16GiB", "--reserve", "600MiB", "--repeats", "7",
                  "--warmup", "0", "--degrees", "1,2", "--resolution", "0", "--max-walks", "9", "--no-cache",
                  "--optimizer", "sgd", "--precision", "bf16", "--costs-from", "model")
    request = workflow_request(args, frontier=True, algos=())
    # 16 GiB = 16 · 2^30 bytes, 600 MiB = 600 · 2^20
    assert request == Request("zoo:gpt2?layers=2", "preset:v100-8-nvlink", batch=4, devices=("gpu0", "gpu1"),
                              budget=17_179_869_184, reserve=629_145_600, repeats=7, warmup=0, degrees=(1, 2),
                              resolution=0, max_walks=9, cache=False, optimizer="sgd", precision="bf16",
                              costs_from="model", frontier=True, algos=())


def test_every_exploring_command_starts_at_the_requests_defaults() -> None:
    for command in ("frontier", "compare", "place"):
        argv = [command, "zoo:gpt2", "--cluster", "preset:v100-8-nvlink"] + (["--algo", "dp"] if command == "place"
                                                                              else [])
        fields = request_fields(_parse(*argv))
        assert fields["repeats"] == 5 and fields["reserve"] == 0 and fields["cache"] is True, command
        assert fields["optimizer"] == "adamw" and fields["costs_from"] == "auto", command
    # the other commands that profile: the same repeats
    assert _parse("simulate", "p.json", "zoo:gpt2", "--cluster", "c").repeats == 5
    assert _parse("profile", "zoo:gpt2").repeats == 5 and _parse("profile", "zoo:gpt2").warmup == 1
    assert _parse("app").repeats == 5


def test_the_help_says_the_default_the_field_has(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("frontier", "--help")
    flat = " ".join(capsys.readouterr().out.split())
    assert "--max-walks N" in flat and "(default 500;" in flat
    assert "timed repeats per operator call (median; default 5)" in flat


def test_a_bad_size_names_its_option() -> None:
    args = _parse("frontier", "zoo:gpt2", "--cluster", "preset:v100-8-nvlink", "--budget", "16Gb")
    with pytest.raises(TensorOptError, match="--budget: unknown size unit 'Gb'"):
        request_fields(args)


def test_the_dashboard_fills_what_its_controls_leave_empty_with_the_same_defaults() -> None:
    req = request_from_controls("zoo", "gpt2", "layers=2", None, None, None, None, "preset", "v100-8-nvlink", None,
                                ["gpu0"], None, None, None, algos=())
    assert (req.repeats, req.warmup, req.optimizer) == (5, 1, "adamw")


def test_every_flag_is_one_fields() -> None:
    flags = [f.metadata["option"].flag for f in dataclasses.fields(Request) if "option" in f.metadata]
    assert len(flags) == len(set(flags))
    assert option_of("cache").flag == "--no-cache" and default_of("cache") is True
    with pytest.raises(KeyError):
        option_of("algos")   # a command's own option (--algos, --algo), not the field's


def test_hsdp_replicate_degrees_are_read_once_and_a_bad_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # --dp-replicate 2,4 (torchtitan's data_parallel_replicate_degree) on frontier and compare; 1 is FSDP itself,
    # always priced, so it is refused as a degree, as is a word; none is no HSDP
    base = ["zoo:gpt2", "--cluster", "preset:h100-hosts?hosts=8"]
    assert request_fields(_parse("frontier", *base, "--dp-replicate", "2,4,2"))["dp_replicate"] == (2, 4)
    assert request_fields(_parse("compare", *base, "--dp-replicate", "none"))["dp_replicate"] == ()
    assert request_fields(_parse("frontier", *base))["dp_replicate"] == ()
    for bad in ("1", "two"):
        with pytest.raises(SystemExit) as stop:
            _parse("frontier", *base, "--dp-replicate", bad)
        assert stop.value.code == 2 and "--dp-replicate" in capsys.readouterr().err
    with pytest.raises(TensorOptError, match="replicate degrees must be whole numbers ≥ 2"):
        Request("zoo:gpt2", "preset:h100-hosts?hosts=8", dp_replicate=(1,))

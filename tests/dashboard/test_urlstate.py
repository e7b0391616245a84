"""The URL's state without a browser: every control the URL holds written and read back, an
upload named by its content; a link never runs a file of this machine by itself."""

from urllib.parse import parse_qsl

from tensoropt.dashboard.pipeline import save_upload
from tensoropt.dashboard.urlstate import URL_KEYS, apply_url, url_state


def test_the_url_holds_the_page_state_and_reads_back(tiny_result, tmp_path):
    """Every control the URL holds comes back from it; defaults are left out; an upload is named by its
    content, not by its path on the server."""
    store = tiny_result[0]
    search = url_state(store, source="zoo", zoo_name="gpt2", zoo_params="layers=6&hidden=256", spec="", onnx_path=None,
                       csource="preset", preset="v100-8-nvlink", cpath=None, devices=["gpu0", "gpu1"], batch=16,
                       optimizer="sgd", precision="bf16", costs="model", budget=2.5, reserve=0.5,
                       price={"v100-sxm2-16gb": 2.0, "l4": None}, epoch=5000, plan="p003-2dev",
                       pipelines=["gpipe", "1f1b"])
    assert search.startswith("?model=zoo:gpt2%3Flayers%3D6%26hidden%3D256&cluster=preset:v100-8-nvlink"
                             "&devices=gpu0,gpu1")
    got = apply_url(search, store)
    assert got == {"run": True, "messages": [], "model_source": "zoo", "zoo_name": "gpt2",
                   "zoo_params": "layers=6&hidden=256", "model_spec": "", "cluster_source": "preset",
                   "cluster_preset": "v100-8-nvlink",
                   "devices": ["gpu0", "gpu1"], "batch": 16, "optimizer": "sgd", "precision": "bf16",
                   "pipelines": ["gpipe", "1f1b"], "costs": "model",
                   "budget": 2.5, "reserve": 0.5, "epoch": 5000, "prices": {"v100-sxm2-16gb": 2.0}, "plan": "p003-2dev"}
    assert set(URL_KEYS) == {k for k, _ in parse_qsl(search[1:])}
    # nothing set, nothing said: the page's defaults stay
    assert apply_url("", store) == {"run": True, "messages": []}
    # an uploaded cluster travels as upload:NAME and comes back as the same file
    up = save_upload(store, b"name: c\ndevices: []\n", ".yaml")
    search = url_state(store, source="zoo", zoo_name="gpt2", zoo_params="", spec="", onnx_path=None,
                       csource="upload", preset=None, cpath=str(up), devices=None)
    assert f"cluster=upload:{up.name}" in search and str(up.parent) not in search
    assert apply_url(search, store)["cluster_path"] == str(up)


def test_a_link_never_runs_a_file_of_this_machine(tiny_result):
    """A link may name any model spec, but only a zoo model or an upload runs at once: a
    ``file.py:factory`` spec (code of this machine) is filled in and waits for the run button; a
    missing upload, an unknown cluster and bad numbers are said or dropped."""
    store = tiny_result[0]
    got = apply_url("?model=/tmp/evil.py:build&cluster=preset:titan-rtx-5", store)
    assert got["run"] is False and got["model_source"] == "spec" and got["model_spec"] == "/tmp/evil.py:build"
    assert "press run" in got["messages"][0]
    # the model the server was started with is the page's own default: a link runs it
    assert apply_url("?model=/tmp/evil.py:build", store, trusted=("/tmp/evil.py:build",))["run"] is True
    got = apply_url("?model=upload:0123abcd.onnx&cluster=/etc/passwd&budget=-3&batch=x&price=v100:abc", store)
    assert got["run"] is False and "model_source" not in got and "budget" not in got and "batch" not in got
    assert got["prices"] == {} and len(got["messages"]) == 2
    assert apply_url("?model=upload:../../etc/passwd.onnx", store)["run"] is False   # no path out of the uploads
    # schedules that are not priced are dropped; those that are keep the priced order
    assert apply_url("?pipelines=zbv,1f1b,gpipe", store)["pipelines"] == ["gpipe", "1f1b"]


def test_the_url_names_the_model_the_run_asks_for(tiny_result):
    """A spec typed while the zoo is chosen is the run's model (requests.chosen_source), and the link's; a
    zoo link empties the spec box, which would otherwise win over the zoo model it names."""
    store = tiny_result[0]
    search = url_state(store, source="zoo", zoo_name="gpt2", zoo_params="layers=2", spec="zoo:bert?layers=1",
                       onnx_path=None, csource="preset", preset="titan-rtx-5", cpath=None, devices=None)
    assert dict(parse_qsl(search[1:]))["model"] == "zoo:bert?layers=1"
    # the box saying the zoo fields' own spec: the zoo model, as before
    search = url_state(store, source="zoo", zoo_name="gpt2", zoo_params="layers=2", spec="zoo:gpt2?layers=2",
                       onnx_path=None, csource="preset", preset="titan-rtx-5", cpath=None, devices=None)
    assert dict(parse_qsl(search[1:]))["model"] == "zoo:gpt2?layers=2"
    assert apply_url("?model=zoo:gpt2%3Flayers%3D2", store)["model_spec"] == ""

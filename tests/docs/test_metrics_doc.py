"""docs/metrics.md, the Grafana dashboard and compose's ``monitoring`` profile agree with the code: every series
Polar records is documented and every series they name exists; Prometheus scrapes the ports compose serves;
compose accepts the profile. (The doc's shell block runs against a live stack in ``tests/e2e/test_metrics.py``.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "metrics.md").read_text()
SERIES = re.compile(r"\bpolar_[a-z_]+[a-z]")
SAMPLE_SUFFIXES = ("_bucket", "_count", "_sum")


def code_series() -> set[str]:
    """The names polar/observability gives its series (string literals)."""
    sources = "".join(path.read_text() for path in (ROOT / "polar" / "observability").glob("*.py"))
    return set(re.findall(r'"(polar_[a-z_]+)"', sources))


def family(sample: str) -> str:
    for suffix in SAMPLE_SUFFIXES:
        if sample.endswith(suffix):
            return sample.removesuffix(suffix)
    return sample


def test_every_series_is_documented_and_every_documented_series_exists() -> None:
    code = code_series()
    assert len(code) >= 20
    documented = set(re.findall(r"^\| `(polar_[a-z_]+)` \|", DOC, flags=re.M))
    assert documented == code
    assert {family(name) for name in SERIES.findall(DOC)} <= code  # the queries too


def test_the_dashboard_queries_only_series_that_exist() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "polar.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(exprs) >= 15
    used = {family(name) for expr in exprs for name in SERIES.findall(expr)}
    assert used <= code_series()
    assert len(used) >= 15  # most series are on it
    datasource = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    uids = {panel["datasource"]["uid"] for panel in dashboard["panels"] if "datasource" in panel}
    assert uids == {datasource["datasources"][0]["uid"]}


def _bind_port(command: str) -> str:
    return re.search(r"--bind 0\.0\.0\.0:(\d+)", command).group(1)  # type: ignore[union-attr]


def test_prometheus_scrapes_what_compose_serves() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    jobs = {job["job_name"]: job for job in yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())[
        "scrape_configs"]}  # fmt: skip
    assert jobs["polar-api"]["static_configs"][0]["targets"] == [f"api:{_bind_port(services['api']['command'])}"]
    assert jobs["polar-proxy"]["static_configs"][0]["targets"] == [f"proxy:{_bind_port(services['proxy']['command'])}"]
    for service in ("api", "proxy"):  # gunicorn with Polar's settings: /metrics adds up every worker
        assert "-c python:web.gunicorn_conf " in services[service]["command"]
    workers = jobs["polar-workers"]["dns_sd_configs"][0]
    assert set(workers["names"]) == {name for name in services if name.startswith("worker-")}
    environment = compose["x-polar"]["environment"]
    assert str(workers["port"]) == environment["POLAR_WORKER_METRICS_PORT"]
    assert environment["POLAR_WORKER_METRICS_HOST"] == "0.0.0.0"
    # The token file Prometheus reads is the one the container writes at start.
    token_file = jobs["polar-api"]["authorization"]["credentials_file"]
    assert f"> {token_file}" in services["prometheus"]["command"][0]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]
        assert all(port.startswith("127.0.0.1:") for port in services[name]["ports"])
        for volume in services[name]["volumes"]:
            if volume.startswith("./"):
                assert (ROOT / volume.split(":")[0]).exists(), volume
    # The doc's own scrape job has the same shape.
    (example,) = re.findall(r"```yaml\n(.*?)```", DOC, flags=re.S)
    (job,) = yaml.safe_load(example)["scrape_configs"]
    assert set(job) == set(jobs["polar-api"]) and "credentials_file" in job["authorization"]


def test_compose_accepts_the_monitoring_profile(tmp_path: Path) -> None:
    cli = ["docker-compose"] if shutil.which("docker-compose") else None
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        cli = ["docker", "compose"]
    if cli is None:
        pytest.skip("no compose CLI installed (docker compose or docker-compose)")
    shutil.copy(ROOT / "compose.yaml", tmp_path / "compose.yaml")
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "POLAR_API_TOKEN": "t" * 43, "POLAR_FLOWER_PASSWORD": "pw"}
    result = subprocess.run([*cli, "--profile", "monitoring", "config"], cwd=tmp_path, env=env, capture_output=True,
                            text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert {"prometheus", "grafana", "api", "proxy"} <= set(services)
    assert services["prometheus"]["environment"]["POLAR_API_TOKEN"] == "t" * 43

"""environment.yml and pyproject.toml name the same requirements."""
import os
import re
import tomllib

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def test_environment_yml_matches_pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    with open(os.path.join(ROOT, "environment.yml")) as f:
        env = yaml.safe_load(f)
    deps = env["dependencies"]
    assert "python=3.11" in deps
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    pip_reqs = {_norm(r) for r in pip if not r.startswith("-e")}
    wanted = {_norm(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]}
    assert pip_reqs == wanted
    assert project["requires-python"].startswith(">=3.11")


def test_workflow_env_lists_the_runtime_requirements():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    with open(os.path.join(ROOT, "workflow", "envs", "enspipe.yaml")) as f:
        env = yaml.safe_load(f)
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert {_norm(r) for r in pip} == {_norm(r) for r in project["dependencies"]}
    assert "python=3.11" in env["dependencies"] and "sysstat" in env["dependencies"]

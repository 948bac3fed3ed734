"""`prepare_worker`: the Python worker's per-task overheads, trimmed only inside a Spark worker."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import gc, importlib, sys, zipimport
    sys.path.insert(0, sys.argv[1])
    import zipped_module  # Imported through a zipimporter.
    before = zipimport.zipimporter.invalidate_caches
    from pipelines.source.worker import prepare_worker
    prepare_worker()
    prepare_worker()  # Idempotent.
    patched = zipimport.zipimporter.invalidate_caches is not before
    importer = sys.path_importer_cache[sys.argv[1]]
    calls = []
    original = zipimport._read_directory
    zipimport._read_directory = lambda path: calls.append(path) or original(path)
    importlib.invalidate_caches()
    importlib.invalidate_caches()
    print(patched, gc.get_freeze_count() > 0, len(calls), zipped_module.VALUE)
    """
)


def run(tmp_path: Path, worker: bool) -> list[str]:
    archive = tmp_path / "mods.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped_module.py", "VALUE = 7\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_WORKER_FACTORY_SECRET"}
    if worker:
        env["PYTHON_WORKER_FACTORY_SECRET"] = "x"
    root = Path(__file__).resolve().parents[3]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(archive)], env=env, capture_output=True, text=True,
                         check=True, cwd=root)
    return out.stdout.split()


def test_in_a_spark_worker_zip_directories_are_not_reread_and_imports_are_frozen(tmp_path: Path) -> None:
    patched, frozen, rereads, value = run(tmp_path, worker=True)
    if sys.version_info < (3, 12):
        assert patched == "True"
        # The first invalidation reads the directory and notes the archive's size and mtime; the
        # second finds them unchanged and reads nothing.
        assert rereads == "1"
    assert frozen == "True"
    assert value == "7"


def test_outside_a_spark_worker_nothing_changes(tmp_path: Path) -> None:
    patched, frozen, rereads, value = run(tmp_path, worker=False)
    assert (patched, frozen) == ("False", "False")
    if sys.version_info < (3, 12):
        assert rereads == "2"
    assert value == "7"

import os
import pathlib
import tempfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# Mesa warns without a runtime folder.
if not os.path.isdir(os.environ.get("XDG_RUNTIME_DIR", "")):
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp()


@pytest.fixture(scope="session")
def zoo():
    path = pathlib.Path(os.environ.get("KILN_ZOO", REPO.parent / "shared" / "zoo"))
    assert path.is_dir(), f"the model zoo is missing at {path} (set KILN_ZOO)"
    return path

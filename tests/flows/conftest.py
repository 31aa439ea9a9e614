import pytest


@pytest.fixture(scope="session", autouse=True)
def prefect_harness(tmp_path_factory: pytest.TempPathFactory):
    import os

    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect_home"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield

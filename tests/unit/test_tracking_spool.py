"""trainforge.tracking.spool, the part without a server: the spool keeps URIs without their
credentials, and replay takes them back from where the user keeps them."""

from __future__ import annotations

import pytest

from trainforge.tracking.spool import with_credentials


def test_credentials_come_back_from_the_environment_for_the_same_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://user:pass@mlflow.example.com")
    assert (
        with_credentials("https://***@mlflow.example.com") == "https://user:pass@mlflow.example.com"
    )


def test_without_them_the_uri_goes_bare_for_mlflows_username_and_password_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://user:pass@another.example.com")
    assert with_credentials("https://***@mlflow.example.com") == "https://mlflow.example.com"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert with_credentials("http://127.0.0.1:5000") == "http://127.0.0.1:5000"

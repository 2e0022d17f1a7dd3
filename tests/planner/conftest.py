import pytest

from tests.support.tiny_model import write_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny-causal-lm"))


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny-seq-cls"), seq_classification=True)

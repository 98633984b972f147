"""Shared tiny inputs: a raw folder of mixed clips/images and its prepared (Energon-indexed) dataset."""

import pytest

from nemo_vfm.data.prepare import PrepareConfig, prepare
from nemo_vfm.data.synthetic_inputs import write_folder

TOK = {"spatial_compression": 2}  # identity tokenizer: 12 latent channels, H/2 x W/2
TEXT = {"dim": 16, "max_length": 8}


def prepare_folder(raw, out, **kw):
    cfg = dict(input=str(raw), output=str(out), tokenizer_kwargs=TOK, text_encoder_kwargs=TEXT, samples_per_shard=6,
               progress=False)
    cfg.update(kw)
    return prepare(PrepareConfig(**cfg))


@pytest.fixture(scope="session")
def raw_dir(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("raw"), 20, seed=0)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, raw_dir):
    out = tmp_path_factory.mktemp("prepared")
    prepare_folder(raw_dir, out)
    return out


@pytest.fixture(scope="session")
def prepared_b(tmp_path_factory):
    raw = write_folder(tmp_path_factory.mktemp("raw_b"), 8, seed=7, sizes=((1, 32, 32),))
    out = tmp_path_factory.mktemp("prepared_b")
    prepare_folder(raw, out)
    return out

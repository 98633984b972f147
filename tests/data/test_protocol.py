"""Every data module declares the VideoDataModule interface; train() refuses one that does not, before any
run folder exists."""

import lightning as L
import pytest
from conftest import TEXT, TOK

import nemo_vfm.data.dreambooth
import nemo_vfm.data.energon_datamodule
import nemo_vfm.data.synthetic  # noqa: F401  (the modules whose data-module classes are listed below)
from nemo_vfm.data.protocol import MEMBERS, VideoDataModule, check_data_module, missing_members

WANT_MEMBERS = {"latent_shape", "context_dim", "fps", "batch_size", "max_seq_length", "missing_class_samples",
                "tokenizer_spec", "text_encoder_spec", "captions", "build_encoders"}


def _package_modules() -> set[type]:
    """Public LightningDataModule classes defined in nemo_vfm."""
    out, todo = set(), [L.LightningDataModule]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("nemo_vfm.") and not sub.__name__.startswith("_"):
                out.add(sub)
    return out


def _build(cls, tmp_path, prepared):
    from nemo_vfm.data.dreambooth import DreamBoothDataModule
    from nemo_vfm.data.energon_datamodule import EnergonDataModule
    from nemo_vfm.data.synthetic import MockLatentDataModule, ShapesDataModule

    builders = {
        MockLatentDataModule: lambda: MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4,
                                                           context_dim=None, batch_size=2),
        ShapesDataModule: lambda: ShapesDataModule(num_clips=2, num_frames=2, height=8, width=8, batch_size=2),
        DreamBoothDataModule: lambda: DreamBoothDataModule(instance_data=str(tmp_path), instance_prompt="a sks square",
                                                           num_frames=2, height=8, width=8, batch_size=2),
        EnergonDataModule: lambda: EnergonDataModule(str(prepared), micro_batch_size=3, max_seq_length=1024,
                                                     pad_to_multiple=8),
    }
    assert cls in builders, f"{cls.__name__} is a new data module: add it to this test"
    return builders[cls]()


def test_the_protocol_lists_what_train_and_the_strategy_read():
    assert set(MEMBERS) == WANT_MEMBERS
    with pytest.raises(TypeError) as e:
        check_data_module(object())
    msg = str(e.value)
    assert "object" in msg and "nemo_vfm/data/protocol.py" in msg, msg
    assert all(m in msg for m in WANT_MEMBERS), msg


def test_every_data_module_of_the_package_declares_the_interface(tmp_path, prepared):
    classes = _package_modules()
    assert {c.__name__ for c in classes} >= {"MockLatentDataModule", "ShapesDataModule", "DreamBoothDataModule",
                                             "EnergonDataModule"}
    for cls in classes:
        data = _build(cls, tmp_path, prepared)
        check_data_module(data)
        assert isinstance(data, VideoDataModule), cls
        assert len(data.latent_shape) == 4 and isinstance(data.batch_size, int), cls
        assert isinstance(data.missing_class_samples, int) and isinstance(data.captions, list), cls
        encoders = data.build_encoders()
        if data.tokenizer_spec is None:  # no encoders: build_encoders says so too
            assert encoders is None and data.text_encoder_spec is None, cls
        else:
            assert len(encoders) == 2 and data.text_encoder_spec is not None, cls


def test_values_where_a_member_does_not_apply(tmp_path, prepared):
    from nemo_vfm.data.energon_datamodule import EnergonDataModule
    from nemo_vfm.data.synthetic import MockLatentDataModule

    mock = _build(MockLatentDataModule, tmp_path, prepared)
    assert (mock.latent_shape, mock.context_dim, mock.max_seq_length) == ((4, 2, 4, 4), None, None)
    assert (mock.missing_class_samples, mock.tokenizer_spec, mock.captions, mock.build_encoders()) == (0, None, [], None)
    energon = _build(EnergonDataModule, tmp_path, prepared)
    assert (energon.batch_size, energon.micro_batch_size, energon.max_seq_length) == (3, 3, 1024)
    assert energon.latent_shape[0] == 12 and energon.context_dim == TEXT["dim"] and energon.missing_class_samples == 0
    assert energon.tokenizer_spec["kwargs"] == TOK


def test_members_are_found_without_evaluating_properties():
    class Lazy:
        latent_shape = context_dim = fps = max_seq_length = tokenizer_spec = text_encoder_spec = None
        batch_size, missing_class_samples, captions = 1, 0, []

        @property
        def build_encoders(self):
            raise AssertionError("evaluated")

    assert missing_members(Lazy()) == []
    del Lazy.latent_shape
    assert missing_members(Lazy()) == ["latent_shape"]


def test_train_refuses_a_custom_module_without_latent_shape_before_the_run_folder(tmp_path):
    from nemo_vfm.models.dit.model import DiTConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    class NoShape(L.LightningDataModule):
        context_dim, fps, batch_size, max_seq_length, missing_class_samples = 16, None, 2, None, 0
        tokenizer_spec = text_encoder_spec = None
        captions: list = []

        def build_encoders(self):
            return None

    model = DiTConfig(num_layers=1, hidden_size=32, num_heads=4, in_channels=4, context_dim=16)
    log = ExperimentConfig(name="run", root=str(tmp_path / "exp"), tensorboard=False)
    with pytest.raises(TypeError, match=r"NoShape lacks latent_shape of the VideoDataModule interface"):
        train(model=model, data=NoShape(), trainer=TrainerConfig(max_steps=1, accelerator="cpu"), log=log)
    assert not (tmp_path / "exp").exists()

"""An Energon dataset folder never runs code: yaml entries naming a module, class or function outside
megatron.energon's and nemo_vfm's sample/dataset types are refused (naming file, key and value) before the path
reaches Energon, in a dataset folder and in a metadataset and the datasets it references. A MARKER file the
payload would touch proves that nothing ran; ``allow_dataset_code=True`` hands the dataset to Energon as is."""

import shutil

import pytest
import yaml

from nemo_vfm.data.blend import write_blend
from nemo_vfm.data.dataset_trust import UnsafeDatasetError, check_dataset
from nemo_vfm.data.energon_datamodule import EnergonDataModule


def _payload(marker):  # a nested __function__ that Energon calls while it reads dataset.yaml (os.system(command=...))
    return {"__module__": "megatron.energon", "__class__": "CrudeWebdataset",
            "subflavors": {"x": {"__module__": "os", "__function__": "system", "command": f"touch {marker}"}}}


def _copy(prepared, dst, doc=None):
    shutil.copytree(prepared, dst)
    if doc is not None:
        (dst / ".nv-meta" / "dataset.yaml").write_text(yaml.safe_dump(doc))
    return dst


def test_a_prepared_dataset_and_its_blend_still_load(prepared, tmp_path):
    check_dataset(prepared)
    blend = write_blend(tmp_path / "mix.yaml", [(prepared, 1.0)])
    dm = EnergonDataModule(str(blend), micro_batch_size=1, shuffle_buffer_size=None)
    assert next(iter(dm.train_dataloader())) is not None


@pytest.mark.parametrize("case", ["function", "class", "sample_loader"])
def test_a_dataset_that_names_code_is_refused(prepared, tmp_path, case):
    marker = tmp_path / "MARKER"
    doc = {"function": _payload(marker),
           "class": {"__module__": "subprocess", "__class__": "Popen", "args": ["touch", str(marker)]},
           "sample_loader": {"__module__": "megatron.energon", "__class__": "CrudeWebdataset",
                             "sample_loader": "evil.py:sample_loader", "part_filter": "evil.py:part_filter"}}[case]
    ds = _copy(prepared, tmp_path / "ds", doc)
    want = {"function": r"__function__: 'os\.system'", "class": r"__class__: 'subprocess\.Popen'",
            "sample_loader": r"sample_loader: 'evil\.py:sample_loader'"}[case]
    with pytest.raises(UnsafeDatasetError, match=rf"refusing dataset file {ds / '.nv-meta' / 'dataset.yaml'}: "
                                                 rf"{want} .*allow_dataset_code=True"):
        EnergonDataModule(str(ds), micro_batch_size=1)
    assert not marker.exists()


def test_a_metadataset_is_checked_with_every_dataset_it_references(prepared, tmp_path):
    marker = tmp_path / "MARKER"
    evil = _copy(prepared, tmp_path / "evil", _payload(marker))
    inner = write_blend(tmp_path / "inner" / "inner.yaml", [(prepared, 1.0), (evil, 1.0)])
    outer = tmp_path / "outer.yaml"  # a metadataset pointing to another metadataset
    outer.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2",
                                     "splits": {"train": {"blend": [{"weight": 1.0, "path": "inner/inner.yaml"}]}}}))
    with pytest.raises(UnsafeDatasetError, match=rf"refusing dataset file {evil / '.nv-meta' / 'dataset.yaml'}"):
        EnergonDataModule(str(outer), micro_batch_size=1)
    with pytest.raises(UnsafeDatasetError, match=rf"{inner}: __class__: 'os.MetadatasetV2'"):
        inner.write_text(inner.read_text().replace("__module__: megatron.energon", "__module__: os"))
        check_dataset(outer)
    assert not marker.exists()


def test_allow_dataset_code_hands_the_dataset_to_energon(prepared, tmp_path):
    marker = tmp_path / "MARKER"
    ds = _copy(prepared, tmp_path / "ds", _payload(marker))
    with pytest.warns(UserWarning, match="allow_dataset_code=True"):
        dm = EnergonDataModule(str(ds), micro_batch_size=1, allow_dataset_code=True)
        dm.train_dataloader()  # Energon reads dataset.yaml: it runs the payload
    assert marker.exists()  # the payload is real: only the check stood between it and the machine

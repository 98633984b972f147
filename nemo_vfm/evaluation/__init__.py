"""Sample-quality metrics (synthetic shapes data: :mod:`nemo_vfm.evaluation.shapes`)."""

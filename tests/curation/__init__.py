"""Tests of nemo_vfm.curation (a package so that module names do not clash with other areas)."""

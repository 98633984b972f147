"""Kandinsky 6 Video family: the video + audio transformer (Lite / Pro layouts), with the diffusers weights layout."""

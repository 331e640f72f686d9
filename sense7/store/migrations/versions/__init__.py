"""The store's revisions, one plain Python file each (`NNNN_what.py`: `revision`, `down_revision`, `upgrade()`),
applied in order by `sense7.store.migrations`."""

"""File I/O: atomic writes on any ``pyarrow.fs`` filesystem, and checksummed Arrow IPC files."""

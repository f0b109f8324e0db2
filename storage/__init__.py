"""Writing to the disk so that no crash, kill or full disk leaves half a file, or half a
folder, behind: every file and folder the project writes goes through storage/atomic.py.
It imports nothing of the project, so that every floor (model/ and data/ at the bottom
included) can use it."""

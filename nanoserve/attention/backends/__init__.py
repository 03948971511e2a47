"""One attention backend per read path over the paged cache, each in its own file; the
interface they share is ``base.py``, and ``nanoserve.attention.selector`` picks one by name."""

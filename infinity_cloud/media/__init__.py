"""Images and audio: fetching them for a request (`fetch.py`), turning them into model
inputs (`images.py`)."""

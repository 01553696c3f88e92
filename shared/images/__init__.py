"""Image inputs: header parsing before any pixel is decoded (`headers`)."""

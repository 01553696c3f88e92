"""Gateway tests: upload validation against a generated image corpus (pure, no HTTP)."""

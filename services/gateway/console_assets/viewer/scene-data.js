/* No scene embedded: `make demo` writes its own scene-data.js next to its viewer.html. */
window.SPLATQ_SCENE = null;

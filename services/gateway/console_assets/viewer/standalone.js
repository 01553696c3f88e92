/* The stand-alone viewer page (`make demo` writes it next to the artifacts as viewer.html;
 * the gateway serves it at /console/viewer/standalone.html). It shows, first found:
 * the scene embedded in scene-data.js (window.SPLATQ_SCENE: works from a page opened from
 * disk, where browsers refuse to read neighbouring files), else scene.spz, scene.splat or
 * scene.ply fetched from beside the page (when it is served over HTTP), else a file the
 * user opens or drops. */
(function () {
  "use strict";
  var canvas = document.getElementById("canvas");
  var status = document.getElementById("status");
  var viewer = null;

  function show(name, buffer) {
    status.textContent = "Reading " + name + "…";
    return SplatqFormats.parse(name, buffer).then(function (cloud) {
      if (!viewer) viewer = SplatqViewer.create(canvas);
      viewer.setCloud(cloud);
      canvas.dataset.state = "ready";
      canvas.dataset.count = String(cloud.count);
      status.textContent = cloud.count.toLocaleString() + " Gaussians from " + name +
        ". Drag to orbit, scroll to zoom, R resets, F fits.";
    }).catch(function (err) {
      canvas.dataset.state = "error";
      status.textContent = name + ": " + err.message;
    });
  }

  function fromBase64(text) {
    var raw = atob(text);
    var bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    return bytes.buffer;
  }

  function fetchNext(names) {
    if (!names.length || location.protocol === "file:") {
      status.textContent = "Open or drop a .spz, .splat or .ply file.";
      return Promise.resolve();
    }
    return fetch(names[0]).then(function (r) {
      if (!r.ok) throw new Error(r.status);
      return r.arrayBuffer().then(function (b) { return show(names[0], b); });
    }).catch(function () { return fetchNext(names.slice(1)); });
  }

  function openFile(file) {
    file.arrayBuffer().then(function (b) { show(file.name, b); });
  }

  document.getElementById("file").addEventListener("change", function (e) {
    if (e.target.files[0]) openFile(e.target.files[0]);
  });
  canvas.addEventListener("dragover", function (e) { e.preventDefault(); });
  canvas.addEventListener("drop", function (e) {
    e.preventDefault();
    if (e.dataTransfer.files[0]) openFile(e.dataTransfer.files[0]);
  });

  var embedded = window.SPLATQ_SCENE;
  if (embedded && embedded.base64) show(embedded.name, fromBase64(embedded.base64));
  else fetchNext(["scene.spz", "scene.splat", "scene.ply"]);
})();

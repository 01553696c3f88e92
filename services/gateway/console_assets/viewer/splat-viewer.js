/* splatq viewer: a compact WebGL2 Gaussian-splat renderer with an orbit camera.
 *
 * Each Gaussian is a screen-facing quad sized by its projected covariance (EWA splatting:
 * Sigma' = J W Sigma W^T J^T + 0.3 I, cut at 3 sigma), drawn back to front after a radix
 * sort of 32-bit view-depth keys (two 16-bit counting passes) on the CPU, blended
 * premultiplied. 32 bits, not 16: with 16, Gaussians at nearly one depth (a surface seen edge
 * on) tied, and ties drawn in file order made the picture depend on the file's row order.
 * Per-Gaussian data lives in one RGBA32F texture (position + alpha, the covariance's six
 * terms, colour); the sorted order is
 * the only per-frame upload. No worker, no WebAssembly, no eval: it runs under the console's
 * strict Content-Security-Policy and from a page opened from disk.
 *
 * Camera: the input camera's axes (x right, y down, z forward), pinhole with a 49.13 degree
 * field of view, orbiting a target. Pointer drag orbits, wheel and pinch zoom, keys: arrows
 * orbit, + and - zoom, R resets (the front view: the input camera), F fits the scene.
 * Defines the global SplatqViewer.
 */
(function (global) {
  "use strict";

  var FOV_DEG = 49.13;
  var ROW = 1024; // Gaussians per texture row (4 texels each: width 4096)
  var ORBIT_STEP = 0.12; // radians per arrow key
  var ZOOM_STEP = 1.15;

  var VERTEX = [
    "#version 300 es",
    "precision highp float; precision highp int; precision highp sampler2D;",
    "uniform sampler2D u_data; uniform mat3 u_rot; uniform vec3 u_trans;",
    "uniform float u_focal; uniform vec2 u_viewport;",
    "in vec2 a_corner; in uint a_index;",
    "out vec4 v_color; out vec2 v_pos;",
    "void main() {",
    "  int i = int(a_index);",
    "  ivec2 at = ivec2((i % " + ROW + ") * 4, i / " + ROW + ");",
    "  vec4 t0 = texelFetch(u_data, at, 0);",
    "  vec4 t1 = texelFetch(u_data, at + ivec2(1, 0), 0);",
    "  vec4 t2 = texelFetch(u_data, at + ivec2(2, 0), 0);",
    "  vec4 t3 = texelFetch(u_data, at + ivec2(3, 0), 0);",
    "  vec3 c = u_rot * t0.xyz + u_trans;",
    "  if (c.z < 0.02) { gl_Position = vec4(0.0, 0.0, 2.0, 1.0); return; }",
    "  mat3 sigma = mat3(t1.x, t1.y, t1.z, t1.y, t1.w, t2.x, t1.z, t2.x, t2.y);",
    "  float f = u_focal / c.z;",
    "  mat3 J = mat3(f, 0.0, 0.0, 0.0, f, 0.0, -f * c.x / c.z, -f * c.y / c.z, 0.0);",
    "  mat3 T = J * u_rot;",
    "  mat3 cov = T * sigma * transpose(T);",
    "  float a = cov[0][0] + 0.3; float b = cov[0][1]; float d = cov[1][1] + 0.3;",
    "  float mid = 0.5 * (a + d); float rad = length(vec2(0.5 * (a - d), b));",
    "  float l1 = mid + rad; float l2 = max(mid - rad, 0.01);",
    "  vec2 dir = abs(b) > 1e-9 ? normalize(vec2(b, l1 - a)) : (a >= d ? vec2(1.0, 0.0) : vec2(0.0, 1.0));",
    "  vec2 major = min(3.0 * sqrt(l1), 2048.0) * dir;",
    "  vec2 minor = min(3.0 * sqrt(l2), 2048.0) * vec2(-dir.y, dir.x);",
    "  vec2 px = f * c.xy + a_corner.x * major + a_corner.y * minor;",
    "  gl_Position = vec4(2.0 * px.x / u_viewport.x, -2.0 * px.y / u_viewport.y, 0.0, 1.0);",
    "  v_pos = 3.0 * a_corner;",
    "  v_color = vec4(t3.rgb, t0.w);",
    "}",
  ].join("\n");

  var FRAGMENT = [
    "#version 300 es",
    "precision highp float;",
    "in vec4 v_color; in vec2 v_pos; out vec4 color;",
    "void main() {",
    "  float r2 = dot(v_pos, v_pos);",
    "  if (r2 > 9.0) discard;",
    "  float alpha = min(0.99, v_color.a * exp(-0.5 * r2));",
    "  if (alpha < 1.0 / 255.0) discard;",
    "  color = vec4(v_color.rgb * alpha, alpha);",
    "}",
  ].join("\n");

  function compile(gl, type, source) {
    var shader = gl.createShader(type);
    gl.shaderSource(shader, source);
    gl.compileShader(shader);
    if (!gl.getShaderParameter(shader, gl.COMPILE_STATUS)) {
      throw new Error("shader: " + gl.getShaderInfoLog(shader));
    }
    return shader;
  }

  function program(gl) {
    var p = gl.createProgram();
    gl.attachShader(p, compile(gl, gl.VERTEX_SHADER, VERTEX));
    gl.attachShader(p, compile(gl, gl.FRAGMENT_SHADER, FRAGMENT));
    gl.linkProgram(p);
    if (!gl.getProgramParameter(p, gl.LINK_STATUS)) throw new Error("link: " + gl.getProgramInfoLog(p));
    return p;
  }

  /* The texture's texels: per Gaussian (x, y, z, alpha), (s00, s01, s02, s11),
   * (s12, s22, 0, 0), (r, g, b, 0); Sigma = (R S)(R S)^T from the unit quaternion and scale. */
  function packTexels(cloud) {
    var rows = Math.max(1, Math.ceil(cloud.count / ROW));
    var data = new Float32Array(rows * ROW * 16);
    for (var i = 0; i < cloud.count; i++) {
      var o = 16 * i, p = cloud.positions, s = cloud.scales, q = cloud.rotations, c = cloud.colors;
      var w = q[4 * i], x = q[4 * i + 1], y = q[4 * i + 2], z = q[4 * i + 3];
      var r = [
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
      ];
      var m = new Array(9);
      for (var row = 0; row < 3; row++) {
        for (var col = 0; col < 3; col++) m[3 * row + col] = r[3 * row + col] * s[3 * i + col];
      }
      function sig(a, b) {
        return m[3 * a] * m[3 * b] + m[3 * a + 1] * m[3 * b + 1] + m[3 * a + 2] * m[3 * b + 2];
      }
      data[o] = p[3 * i]; data[o + 1] = p[3 * i + 1]; data[o + 2] = p[3 * i + 2];
      data[o + 3] = c[4 * i + 3] / 255;
      data[o + 4] = sig(0, 0); data[o + 5] = sig(0, 1); data[o + 6] = sig(0, 2); data[o + 7] = sig(1, 1);
      data[o + 8] = sig(1, 2); data[o + 9] = sig(2, 2);
      data[o + 12] = c[4 * i] / 255; data[o + 13] = c[4 * i + 1] / 255; data[o + 14] = c[4 * i + 2] / 255;
    }
    return { data: data, width: ROW * 4, height: rows };
  }

  /* Robust bounds: the median point, and the 95th percentile distance from it. */
  function bounds(cloud) {
    var n = cloud.count;
    var step = Math.max(1, Math.floor(n / 20000));
    var axes = [[], [], []];
    for (var i = 0; i < n; i += step) {
      for (var k = 0; k < 3; k++) axes[k].push(cloud.positions[3 * i + k]);
    }
    var center = axes.map(function (a) {
      a.sort(function (u, v) { return u - v; });
      return a.length ? a[a.length >> 1] : 0;
    });
    var dist = [];
    for (i = 0; i < n; i += step) {
      dist.push(Math.hypot(cloud.positions[3 * i] - center[0], cloud.positions[3 * i + 1] - center[1],
        cloud.positions[3 * i + 2] - center[2]));
    }
    dist.sort(function (u, v) { return u - v; });
    var radius = dist.length ? dist[Math.min(dist.length - 1, Math.floor(dist.length * 0.95))] : 1;
    return { center: center, radius: Math.max(radius, 1e-3) };
  }

  function Viewer(canvas, options) {
    this.canvas = canvas;
    this.options = options || {};
    this.background = this.options.background || [0.1, 0.11, 0.13];
    var gl = canvas.getContext("webgl2", { antialias: false, premultipliedAlpha: true,
      preserveDrawingBuffer: !!this.options.preserveDrawingBuffer });
    if (!gl) throw new Error("WebGL2 is not available in this browser");
    this.gl = gl;
    this.prog = program(gl);
    this.u = {};
    var self = this;
    ["u_data", "u_rot", "u_trans", "u_focal", "u_viewport"].forEach(function (name) {
      self.u[name] = gl.getUniformLocation(self.prog, name);
    });
    this.vao = gl.createVertexArray();
    gl.bindVertexArray(this.vao);
    var corners = gl.createBuffer();
    gl.bindBuffer(gl.ARRAY_BUFFER, corners);
    gl.bufferData(gl.ARRAY_BUFFER, new Float32Array([-1, -1, 1, -1, -1, 1, 1, 1]), gl.STATIC_DRAW);
    var loc = gl.getAttribLocation(this.prog, "a_corner");
    gl.enableVertexAttribArray(loc);
    gl.vertexAttribPointer(loc, 2, gl.FLOAT, false, 0, 0);
    this.indexBuffer = gl.createBuffer();
    gl.bindBuffer(gl.ARRAY_BUFFER, this.indexBuffer);
    loc = gl.getAttribLocation(this.prog, "a_index");
    gl.enableVertexAttribArray(loc);
    gl.vertexAttribIPointer(loc, 1, gl.UNSIGNED_INT, 0, 0);
    gl.vertexAttribDivisor(loc, 1);
    this.texture = gl.createTexture();
    this.cloud = null;
    this.front = { target: [0, 0, 2], distance: 2, yaw: 0, pitch: 0 };
    this.view = Object.assign({}, this.front);
    this.pointers = new Map();
    this.dirty = true;
    this._listen();
    this._frame = this._frame.bind(this);
    this.raf = requestAnimationFrame(this._frame);
  }

  Viewer.prototype.setCloud = function (cloud) {
    var gl = this.gl;
    var packed = packTexels(cloud);
    gl.bindTexture(gl.TEXTURE_2D, this.texture);
    gl.texImage2D(gl.TEXTURE_2D, 0, gl.RGBA32F, packed.width, packed.height, 0, gl.RGBA, gl.FLOAT, packed.data);
    gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MIN_FILTER, gl.NEAREST);
    gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MAG_FILTER, gl.NEAREST);
    this.cloud = cloud;
    this.order = new Uint32Array(cloud.count);
    this.depths = new Float32Array(cloud.count);
    this.keys = new Uint32Array(cloud.count);
    this.pass = new Uint32Array(cloud.count);
    gl.bindBuffer(gl.ARRAY_BUFFER, this.indexBuffer);
    gl.bufferData(gl.ARRAY_BUFFER, this.order.byteLength || 4, gl.DYNAMIC_DRAW);
    this.box = bounds(cloud);
    // The front view is the input camera (at the origin, looking down +z), orbiting the
    // scene's median depth; a scene not in front of the origin opens fitted instead.
    if (this.box.center[2] > 0) {
      var depth = this.box.center[2];
      this.front = { target: [0, 0, depth], distance: depth, yaw: 0, pitch: 0 };
    } else {
      this.front = this._fitted({ yaw: 0, pitch: 0 });
    }
    this.reset();
  };

  Viewer.prototype._fitted = function (angles) {
    var half = (FOV_DEG * Math.PI) / 360;
    return { target: this.box.center.slice(), distance: (this.box.radius / Math.sin(half)) * 1.05,
      yaw: angles.yaw, pitch: angles.pitch };
  };

  Viewer.prototype.reset = function () {
    this.view = { target: this.front.target.slice(), distance: this.front.distance,
      yaw: this.front.yaw, pitch: this.front.pitch };
    this.dirty = true;
  };

  Viewer.prototype.fit = function () {
    if (!this.box) return;
    this.view = this._fitted(this.view);
    this.dirty = true;
  };

  Viewer.prototype.orbit = function (dyaw, dpitch) {
    this.view.yaw += dyaw;
    this.view.pitch = Math.max(-1.5, Math.min(1.5, this.view.pitch + dpitch));
    this.dirty = true;
  };

  Viewer.prototype.zoom = function (factor) {
    this.view.distance = Math.max(1e-3, Math.min(1e4, this.view.distance * factor));
    this.dirty = true;
  };

  /* World -> camera: R = Rx(pitch) Ry(yaw); the eye sits `distance` behind the target. */
  Viewer.prototype._pose = function () {
    var v = this.view, cy = Math.cos(v.yaw), sy = Math.sin(v.yaw), cp = Math.cos(v.pitch), sp = Math.sin(v.pitch);
    var ry = [cy, 0, -sy, 0, 1, 0, sy, 0, cy]; // row-major
    var rx = [1, 0, 0, 0, cp, sp, 0, -sp, cp];
    var r = new Array(9);
    for (var i = 0; i < 3; i++) {
      for (var j = 0; j < 3; j++) {
        r[3 * i + j] = rx[3 * i] * ry[j] + rx[3 * i + 1] * ry[3 + j] + rx[3 * i + 2] * ry[6 + j];
      }
    }
    // t = -R eye, eye = target - distance * R^T e_z  =>  t = -R target + distance * e_z
    var t = [0, 0, 0];
    for (i = 0; i < 3; i++) {
      t[i] = -(r[3 * i] * v.target[0] + r[3 * i + 1] * v.target[1] + r[3 * i + 2] * v.target[2]);
    }
    t[2] += v.distance;
    return { r: r, t: t };
  };

  /* One stable counting pass of a radix sort: `from` ordered by 16 bits of the keys. */
  function countingPass(keys, from, to, shift, counts) {
    counts.fill(0);
    var n = from.length, i;
    for (i = 0; i < n; i++) counts[(keys[from[i]] >>> shift) & 0xffff]++;
    for (i = 1; i < 65536; i++) counts[i] += counts[i - 1];
    for (i = n - 1; i >= 0; i--) to[--counts[(keys[from[i]] >>> shift) & 0xffff]] = from[i];
  }

  /* Back to front: 32-bit keys of the view depths (the farthest first), radix sorted. */
  Viewer.prototype._sort = function (pose) {
    var n = this.cloud.count, p = this.cloud.positions, r = pose.r, depths = this.depths;
    var lo = Infinity, hi = -Infinity;
    for (var i = 0; i < n; i++) {
      var z = r[6] * p[3 * i] + r[7] * p[3 * i + 1] + r[8] * p[3 * i + 2];
      depths[i] = z;
      if (z < lo) lo = z;
      if (z > hi) hi = z;
    }
    var scale = hi > lo ? 4294967295 / (hi - lo) : 0;
    for (i = 0; i < n; i++) {
      this.keys[i] = Math.min(4294967295, Math.floor((hi - depths[i]) * scale));
      this.pass[i] = i;
    }
    this.counts = this.counts || new Uint32Array(65536);
    countingPass(this.keys, this.pass, this.order, 0, this.counts);
    countingPass(this.keys, this.order, this.pass, 16, this.counts);
    this.order.set(this.pass);
    var gl = this.gl;
    gl.bindBuffer(gl.ARRAY_BUFFER, this.indexBuffer);
    gl.bufferSubData(gl.ARRAY_BUFFER, 0, this.order);
  };

  Viewer.prototype.render = function () {
    var gl = this.gl, canvas = this.canvas;
    var dpr = Math.min(global.devicePixelRatio || 1, 2);
    var w = Math.max(1, Math.round(canvas.clientWidth * dpr));
    var h = Math.max(1, Math.round(canvas.clientHeight * dpr));
    if (canvas.width !== w || canvas.height !== h) {
      canvas.width = w;
      canvas.height = h;
    }
    gl.viewport(0, 0, w, h);
    var bg = this.background;
    gl.clearColor(bg[0], bg[1], bg[2], 1);
    gl.clear(gl.COLOR_BUFFER_BIT);
    if (!this.cloud || this.cloud.count === 0) return;
    var pose = this._pose();
    this._sort(pose);
    gl.useProgram(this.prog);
    gl.bindVertexArray(this.vao);
    gl.activeTexture(gl.TEXTURE0);
    gl.bindTexture(gl.TEXTURE_2D, this.texture);
    gl.uniform1i(this.u.u_data, 0);
    var r = pose.r; // GLSL mat3 is column-major: pass the transpose of row-major r
    gl.uniformMatrix3fv(this.u.u_rot, false, [r[0], r[3], r[6], r[1], r[4], r[7], r[2], r[5], r[8]]);
    gl.uniform3fv(this.u.u_trans, pose.t);
    gl.uniform1f(this.u.u_focal, (0.5 * Math.min(w, h)) / Math.tan((FOV_DEG * Math.PI) / 360));
    gl.uniform2f(this.u.u_viewport, w, h);
    gl.disable(gl.DEPTH_TEST);
    gl.enable(gl.BLEND);
    gl.blendFunc(gl.ONE, gl.ONE_MINUS_SRC_ALPHA);
    gl.drawArraysInstanced(gl.TRIANGLE_STRIP, 0, 4, this.cloud.count);
    this.frames = (this.frames || 0) + 1;
    this.canvas.dataset.frames = String(this.frames);
  };

  Viewer.prototype._frame = function () {
    if (this.destroyed) return;
    var w = this.canvas.clientWidth, h = this.canvas.clientHeight;
    if (w !== this.lastW || h !== this.lastH) {
      this.lastW = w;
      this.lastH = h;
      this.dirty = true;
    }
    if (this.dirty) {
      this.dirty = false;
      this.render();
    }
    this.raf = requestAnimationFrame(this._frame);
  };

  Viewer.prototype._listen = function () {
    var self = this, canvas = this.canvas;
    this.handlers = {
      pointerdown: function (e) {
        canvas.setPointerCapture(e.pointerId);
        self.pointers.set(e.pointerId, { x: e.clientX, y: e.clientY });
      },
      pointermove: function (e) {
        var last = self.pointers.get(e.pointerId);
        if (!last) return;
        if (self.pointers.size === 1) {
          var scale = 4 / Math.max(canvas.clientWidth, 1);
          self.orbit((e.clientX - last.x) * scale, -(e.clientY - last.y) * scale);
        } else if (self.pointers.size === 2) {
          var other = Array.from(self.pointers.entries()).find(function (kv) { return kv[0] !== e.pointerId; })[1];
          var before = Math.hypot(last.x - other.x, last.y - other.y);
          var after = Math.hypot(e.clientX - other.x, e.clientY - other.y);
          if (before > 0 && after > 0) self.zoom(before / after);
        }
        self.pointers.set(e.pointerId, { x: e.clientX, y: e.clientY });
      },
      pointerup: function (e) { self.pointers.delete(e.pointerId); },
      pointercancel: function (e) { self.pointers.delete(e.pointerId); },
      wheel: function (e) {
        e.preventDefault();
        self.zoom(Math.pow(1.0015, e.deltaY));
      },
      keydown: function (e) {
        var key = e.key;
        if (key === "ArrowLeft") self.orbit(-ORBIT_STEP, 0);
        else if (key === "ArrowRight") self.orbit(ORBIT_STEP, 0);
        else if (key === "ArrowUp") self.orbit(0, ORBIT_STEP);
        else if (key === "ArrowDown") self.orbit(0, -ORBIT_STEP);
        else if (key === "+" || key === "=") self.zoom(1 / ZOOM_STEP);
        else if (key === "-" || key === "_") self.zoom(ZOOM_STEP);
        else if (key === "r" || key === "R" || key === "0") self.reset();
        else if (key === "f" || key === "F") self.fit();
        else return;
        e.preventDefault();
      },
    };
    Object.keys(this.handlers).forEach(function (name) {
      canvas.addEventListener(name, self.handlers[name], name === "wheel" ? { passive: false } : undefined);
    });
  };

  Viewer.prototype.destroy = function () {
    var self = this;
    this.destroyed = true;
    cancelAnimationFrame(this.raf);
    Object.keys(this.handlers).forEach(function (name) {
      self.canvas.removeEventListener(name, self.handlers[name]);
    });
    var lose = this.gl.getExtension("WEBGL_lose_context");
    if (lose) lose.loseContext();
  };

  global.SplatqViewer = {
    create: function (canvas, options) { return new Viewer(canvas, options); },
    FOV_DEG: FOV_DEG,
  };
})(typeof window !== "undefined" ? window : globalThis);

/* splatq viewer: readers of the three Gaussian-splat files a job produces.
 *
 * parseSpz (Niantic .spz, versions 2 and 3), parseSplat (antimatter15 .splat, 32 bytes a
 * Gaussian) and parsePly (binary little-endian 3DGS .ply) all return one shape, in the PLY's
 * axes (the input camera's: x right, y down, z forward):
 *   { count, positions: Float32Array(3n), scales: Float32Array(3n) (linear),
 *     rotations: Float32Array(4n) (unit w, x, y, z), colors: Uint8Array(4n) (RGBA) }
 * A classic script (no module): it works from a page opened from disk too (make demo's
 * viewer.html). Defines the global SplatqFormats.
 */
(function (global) {
  "use strict";

  var SH_C0 = 0.28209479177387814;
  var SPZ_COLOR_SCALE = 0.15;
  var SQRT_HALF = Math.SQRT1_2;

  function clampByte(x) {
    return x < 0 ? 0 : x > 255 ? 255 : Math.round(x);
  }

  function sigmoid(x) {
    return 1 / (1 + Math.exp(-x));
  }

  function cloud(count) {
    return {
      count: count,
      positions: new Float32Array(count * 3),
      scales: new Float32Array(count * 3),
      rotations: new Float32Array(count * 4),
      colors: new Uint8Array(count * 4),
    };
  }

  function setRotation(out, i, w, x, y, z) {
    var n = Math.hypot(w, x, y, z);
    if (!(n > 0)) {
      w = 1; x = 0; y = 0; z = 0; n = 1;
    }
    out.rotations[4 * i] = w / n;
    out.rotations[4 * i + 1] = x / n;
    out.rotations[4 * i + 2] = y / n;
    out.rotations[4 * i + 3] = z / n;
  }

  /* .splat: position 3 x f32, linear scale 3 x f32, RGBA 4 x u8, rotation (w,x,y,z) 4 x u8. */
  function parseSplat(buffer) {
    if (buffer.byteLength % 32 !== 0) {
      throw new Error(".splat size " + buffer.byteLength + " is not a multiple of 32 bytes");
    }
    var n = buffer.byteLength / 32;
    var view = new DataView(buffer);
    var bytes = new Uint8Array(buffer);
    var out = cloud(n);
    for (var i = 0; i < n; i++) {
      var o = 32 * i;
      for (var k = 0; k < 3; k++) {
        out.positions[3 * i + k] = view.getFloat32(o + 4 * k, true);
        out.scales[3 * i + k] = view.getFloat32(o + 12 + 4 * k, true);
      }
      for (k = 0; k < 4; k++) out.colors[4 * i + k] = bytes[o + 24 + k];
      setRotation(out, i, (bytes[o + 28] - 128) / 128, (bytes[o + 29] - 128) / 128,
        (bytes[o + 30] - 128) / 128, (bytes[o + 31] - 128) / 128);
    }
    return out;
  }

  var PLY_TYPES = {
    char: ["getInt8", 1], int8: ["getInt8", 1], uchar: ["getUint8", 1], uint8: ["getUint8", 1],
    short: ["getInt16", 2], int16: ["getInt16", 2], ushort: ["getUint16", 2],
    uint16: ["getUint16", 2], int: ["getInt32", 4], int32: ["getInt32", 4],
    uint: ["getUint32", 4], uint32: ["getUint32", 4], float: ["getFloat32", 4],
    float32: ["getFloat32", 4], double: ["getFloat64", 8], float64: ["getFloat64", 8],
  };

  function plyHeader(bytes) {
    var text = "";
    var limit = Math.min(bytes.length, 65536);
    for (var i = 0; i < limit; i++) text += String.fromCharCode(bytes[i]);
    var end = text.indexOf("end_header\n");
    if (text.slice(0, 4) !== "ply\n" || end < 0) throw new Error("not a .ply file");
    var lines = text.slice(0, end).split("\n");
    if (lines[1].trim() !== "format binary_little_endian 1.0") {
      throw new Error(".ply must be binary little-endian");
    }
    var elements = [];
    lines.slice(2).forEach(function (line) {
      var w = line.trim().split(/\s+/);
      if (w[0] === "element") elements.push({ name: w[1], count: +w[2], props: [], size: 0 });
      else if (w[0] === "property") {
        var el = elements[elements.length - 1];
        if (!el || w[1] === "list" || !PLY_TYPES[w[1]]) {
          throw new Error(".ply property not supported: " + line);
        }
        el.props.push({ name: w[2], type: PLY_TYPES[w[1]], at: el.size });
        el.size += PLY_TYPES[w[1]][1];
      }
    });
    return { elements: elements, bodyStart: end + "end_header\n".length };
  }

  function parsePly(buffer) {
    var bytes = new Uint8Array(buffer);
    var head = plyHeader(bytes);
    var offset = head.bodyStart;
    var vertex = null;
    for (var e = 0; e < head.elements.length; e++) {
      if (head.elements[e].name === "vertex") {
        vertex = head.elements[e];
        break;
      }
      offset += head.elements[e].count * head.elements[e].size;
    }
    if (!vertex) throw new Error(".ply has no vertex element");
    if (offset + vertex.count * vertex.size > buffer.byteLength) throw new Error(".ply is truncated");
    var view = new DataView(buffer);
    var prop = {};
    vertex.props.forEach(function (p) { prop[p.name] = p; });
    ["x", "y", "z"].forEach(function (name) {
      if (!prop[name]) throw new Error(".ply vertex has no " + name);
    });
    function reader(name, fallback) {
      var p = prop[name];
      if (!p) return function () { return fallback; };
      var get = view[p.type[0]].bind(view);
      return function (row) { return get(row + p.at, true); };
    }
    var px = reader("x", 0), py = reader("y", 0), pz = reader("z", 0);
    var dc = [reader("f_dc_0", null), reader("f_dc_1", null), reader("f_dc_2", null)];
    var rgb = [reader("red", 200), reader("green", 200), reader("blue", 200)];
    var op = reader("opacity", null);
    var sc = [reader("scale_0", -4.6), reader("scale_1", -4.6), reader("scale_2", -4.6)];
    var rot = [reader("rot_0", 1), reader("rot_1", 0), reader("rot_2", 0), reader("rot_3", 0)];
    var hasDc = !!prop.f_dc_0;
    var out = cloud(vertex.count);
    for (var i = 0; i < vertex.count; i++) {
      var row = offset + i * vertex.size;
      out.positions[3 * i] = px(row);
      out.positions[3 * i + 1] = py(row);
      out.positions[3 * i + 2] = pz(row);
      for (var k = 0; k < 3; k++) {
        out.scales[3 * i + k] = Math.exp(sc[k](row));
        out.colors[4 * i + k] = hasDc ? clampByte((0.5 + SH_C0 * dc[k](row)) * 255) : rgb[k](row);
      }
      var o = op(row);
      out.colors[4 * i + 3] = o === null ? 255 : clampByte(sigmoid(o) * 255);
      setRotation(out, i, rot[0](row), rot[1](row), rot[2](row), rot[3](row));
    }
    return out;
  }

  /* .spz: gzip of a 16-byte header, then positions, alphas, colours, scales, rotations, SH.
   * Stored in RUB axes: y and z flip back to the PLY's. */
  function parseSpzBytes(raw) {
    var view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
    if (raw.length < 16 || view.getUint32(0, true) !== 0x5053474e) throw new Error("not a .spz file");
    var version = view.getUint32(4, true);
    var n = view.getUint32(8, true);
    var degree = raw[12], bits = raw[13], flags = raw[14];
    if (version !== 2 && version !== 3) throw new Error(".spz version " + version + " is not supported");
    if (flags & 2) throw new Error(".spz extensions are not supported");
    var rotBytes = version === 3 ? 4 : 3;
    var shDims = [0, 3, 8, 15, 24][degree];
    if (shDims === undefined) throw new Error(".spz SH degree " + degree + " is not supported");
    var at = { pos: 16 };
    at.alpha = at.pos + 9 * n;
    at.color = at.alpha + n;
    at.scale = at.color + 3 * n;
    at.rot = at.scale + 3 * n;
    at.end = at.rot + rotBytes * n + 3 * shDims * n;
    if (raw.length < at.end) throw new Error(".spz is truncated");
    var out = cloud(n);
    var step = 1 / (1 << bits);
    var flip = [1, -1, -1];
    var q = [0, 0, 0, 0];
    for (var i = 0; i < n; i++) {
      for (var k = 0; k < 3; k++) {
        var b = at.pos + 9 * i + 3 * k;
        var fixed = raw[b] | (raw[b + 1] << 8) | (raw[b + 2] << 16);
        if (fixed & 0x800000) fixed -= 0x1000000;
        out.positions[3 * i + k] = flip[k] * fixed * step;
        out.scales[3 * i + k] = Math.exp(raw[at.scale + 3 * i + k] / 16 - 10);
        var dc = (raw[at.color + 3 * i + k] / 255 - 0.5) / SPZ_COLOR_SCALE;
        out.colors[4 * i + k] = clampByte((0.5 + SH_C0 * dc) * 255);
      }
      out.colors[4 * i + 3] = raw[at.alpha + i];
      if (version === 3) {
        var word = view.getUint32(at.rot + 4 * i, true);
        var largest = word >>> 30;
        var sum = 0;
        for (var c = 3; c >= 0; c--) {
          if (c === largest) continue;
          var mag = word & 511;
          var value = (SQRT_HALF * mag) / 511;
          q[c] = word & 512 ? -value : value;
          sum += q[c] * q[c];
          word >>>= 10;
        }
        q[largest] = Math.sqrt(Math.max(0, 1 - sum));
      } else {
        for (c = 0; c < 3; c++) q[c] = raw[at.rot + 3 * i + c] / 127.5 - 1;
        q[3] = Math.sqrt(Math.max(0, 1 - q[0] * q[0] - q[1] * q[1] - q[2] * q[2]));
      }
      // stored (x, y, z, w) in RUB; a half turn about x maps it back: (w, x, -y, -z)
      setRotation(out, i, q[3], q[0], -q[1], -q[2]);
    }
    return out;
  }

  function parseSpz(buffer) {
    var stream = new Blob([buffer]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).arrayBuffer().then(function (raw) {
      return parseSpzBytes(new Uint8Array(raw));
    });
  }

  /* The cloud in a file's bytes, by the name's extension: a promise. */
  function parse(name, buffer) {
    var ext = String(name).toLowerCase().split(".").pop();
    try {
      if (ext === "spz") return parseSpz(buffer);
      if (ext === "splat") return Promise.resolve(parseSplat(buffer));
      if (ext === "ply") return Promise.resolve(parsePly(buffer));
    } catch (err) {
      return Promise.reject(err);
    }
    return Promise.reject(new Error("not a .spz, .splat or .ply file: " + name));
  }

  global.SplatqFormats = {
    parse: parse,
    parseSpz: parseSpz,
    parseSplat: parseSplat,
    parsePly: parsePly,
  };
})(typeof window !== "undefined" ? window : globalThis);

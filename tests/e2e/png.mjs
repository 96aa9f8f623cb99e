// Minimal PNG decoder (8-bit RGB/RGBA, non-interlaced) for screenshot checks, using node's zlib only.
import zlib from "node:zlib";

export function decodePng(buf) {
  let pos = 8, width = 0, height = 0, colorType = 0;
  const idat = [];
  while (pos < buf.length) {
    const len = buf.readUInt32BE(pos);
    const type = buf.toString("ascii", pos + 4, pos + 8);
    const data = buf.subarray(pos + 8, pos + 8 + len);
    if (type === "IHDR") { width = data.readUInt32BE(0); height = data.readUInt32BE(4); colorType = data[9]; }
    else if (type === "IDAT") idat.push(data);
    pos += 12 + len;
  }
  const bpp = colorType === 6 ? 4 : 3;
  const raw = zlib.inflateSync(Buffer.concat(idat));
  const stride = width * bpp;
  const out = Buffer.alloc(height * stride);
  for (let y = 0; y < height; y++) {
    const f = raw[y * (stride + 1)];
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    for (let x = 0; x < stride; x++) {
      const a = x >= bpp ? out[y * stride + x - bpp] : 0;
      const b = y > 0 ? out[(y - 1) * stride + x] : 0;
      const c = x >= bpp && y > 0 ? out[(y - 1) * stride + x - bpp] : 0;
      let v = line[x];
      if (f === 1) v += a;
      else if (f === 2) v += b;
      else if (f === 3) v += (a + b) >> 1;
      else if (f === 4) { const p = a + b - c, pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c); v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c; }
      out[y * stride + x] = v & 255;
    }
  }
  return { width, height, bpp, pixels: out };
}

// Number of distinct colours in a rectangle: a blank or single-colour region has 1-2.
export function distinctColors(img, x0, y0, w, h) {
  const seen = new Set();
  for (let y = y0; y < Math.min(img.height, y0 + h); y += 1)
    for (let x = x0; x < Math.min(img.width, x0 + w); x += 1) {
      const i = (y * img.width + x) * img.bpp;
      seen.add((img.pixels[i] << 16) | (img.pixels[i + 1] << 8) | img.pixels[i + 2]);
    }
  return seen.size;
}

// Share of a rectangle's pixels for which keep(r, g, b) holds: how much of a chart a colour covers.
export function share(img, x0, y0, w, h, keep) {
  let hits = 0, all = 0;
  for (let y = y0; y < Math.min(img.height, y0 + h); y += 1)
    for (let x = x0; x < Math.min(img.width, x0 + w); x += 1) {
      const i = (y * img.width + x) * img.bpp;
      all += 1;
      if (keep(img.pixels[i], img.pixels[i + 1], img.pixels[i + 2])) hits += 1;
    }
  return all ? hits / all : 0;
}

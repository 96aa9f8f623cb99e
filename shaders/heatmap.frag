// The fit explorer's cells: each value (peak / usable memory, one texel per cell, R32F) coloured by the scale's
// bands; the gap between two cells on either side of the boundary is drawn as the boundary line. The same rules
// as the draw-list fallback in src/ui/chart.cpp, which must stay in step with this file.
uniform sampler2D u_values;  // w x h, row 0 on top; texelFetch only, so no filtering or mipmaps are involved
uniform ivec2 u_grid;        // w, h
uniform vec2 u_cell;         // cell size in ImGui pixels, gap included
uniform float u_gap;         // ImGui pixels on the right and bottom of each cell
uniform float u_lo;          // below it: no value
uniform float u_band_hi[3];  // band i covers (u_band_hi[i-1], u_band_hi[i]], the first starts at u_lo
uniform vec4 u_band_lo_color[3];
uniform vec4 u_band_hi_color[3];
uniform vec4 u_missing;
uniform float u_boundary;
uniform vec4 u_boundary_color;

in vec2 v_local;
out vec4 frag_color;

float value_at(ivec2 c) { return texelFetch(u_values, c, 0).r; }

vec4 scale_color(float v) {
  if (!(v >= u_lo)) return u_missing;
  float lo = u_lo;
  for (int i = 0; i < 3; ++i) {
    if (v <= u_band_hi[i]) {
      float t = u_band_hi[i] > lo ? (v - lo) / (u_band_hi[i] - lo) : 0.0;
      return mix(u_band_lo_color[i], u_band_hi_color[i], t);
    }
    lo = u_band_hi[i];
  }
  return u_band_hi_color[2];
}

// -1: no cell or no value there, 0: within the boundary, 1: over it.
int side(ivec2 c) {
  if (c.x >= u_grid.x || c.y >= u_grid.y) return -1;
  float v = value_at(c);
  return !(v >= u_lo) ? -1 : (v > u_boundary ? 1 : 0);
}

bool crosses(int a, int b, int c, int d) {
  bool within = a == 0 || b == 0 || c == 0 || d == 0;
  bool over = a == 1 || b == 1 || c == 1 || d == 1;
  return within && over;
}

void main() {
  ivec2 c = clamp(ivec2(floor(v_local / u_cell)), ivec2(0), u_grid - 1);
  vec2 within = v_local - vec2(c) * u_cell;
  bool gap_x = within.x >= u_cell.x - u_gap, gap_y = within.y >= u_cell.y - u_gap;
  if (!gap_x && !gap_y) {
    frag_color = scale_color(value_at(c));
    return;
  }
  int here = side(c), right = side(c + ivec2(1, 0)), below = side(c + ivec2(0, 1));
  bool line = gap_x && gap_y ? crosses(here, right, below, side(c + ivec2(1, 1)))
              : gap_x        ? crosses(here, right, -1, -1)
                             : crosses(here, below, -1, -1);
  if (!line) discard;
  frag_color = u_boundary_color;
}

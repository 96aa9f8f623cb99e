// The timeline's columns: one instance per quad, its corners made from gl_VertexID (a 4-vertex strip), so the
// only buffer is the instances themselves. Chart units map to ImGui's coordinates, then to clip space the way
// ImGui's own projection does, so the quads line up with the text and lines ImGui draws around them.
layout(location = 0) in vec4 a_quad;   // x0, x1, y0, y1 in chart units (per instance)
layout(location = 1) in vec4 a_color;  // normalised RGBA (per instance)

uniform vec4 u_view;     // x_min, x_max, y_min, y_max: the chart units shown
uniform vec4 u_rect;     // x0, y0, x1, y1: where they land, in ImGui coordinates (y down)
uniform vec4 u_display;  // ImGui's display: x, y, width, height
uniform vec2 u_scale;    // framebuffer pixels per ImGui unit

out vec4 v_color;

vec2 to_screen(vec2 chart) {
  vec2 t = (chart - u_view.xz) / (u_view.yw - u_view.xz);
  return vec2(mix(u_rect.x, u_rect.z, t.x), mix(u_rect.w, u_rect.y, t.y));  // chart y points up
}

void main() {
  // A quad between two pixel centres produces no fragment, but a software rasteriser still sets it up and bins
  // it: with many quads per pixel (a column per event) that is most of the cost. Such quads are moved out of
  // the clip volume here, where they are rejected whole. The margin keeps any quad a rasteriser might hit.
  vec2 lo = to_screen(a_quad.xz), hi = to_screen(a_quad.yw);
  float x0 = (lo.x - u_display.x) * u_scale.x, x1 = (hi.x - u_display.x) * u_scale.x;
  if (ceil(x0 - 0.5 - 1.0 / 64.0) >= ceil(x1 - 0.5 + 1.0 / 64.0)) {
    gl_Position = vec4(-2.0, -2.0, 0.0, 1.0);
    v_color = vec4(0.0);
    return;
  }
  vec2 corner = vec2(float(gl_VertexID & 1), float(gl_VertexID >> 1));
  vec2 p = mix(lo, hi, corner);
  vec2 ndc = (p - u_display.xy) / u_display.zw * 2.0 - 1.0;
  gl_Position = vec4(ndc.x, -ndc.y, 0.0, 1.0);
  v_color = a_color;
}

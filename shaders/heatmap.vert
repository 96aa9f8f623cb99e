// One quad over the whole grid; the fragment shader finds the cell. v_local is in ImGui pixels from the grid's
// top-left corner, so the gaps between cells come out as wide as ImGui would draw them.
uniform vec4 u_rect;     // x0, y0, x1, y1 of the grid in ImGui coordinates
uniform vec4 u_display;  // ImGui's display: x, y, width, height

out vec2 v_local;

void main() {
  vec2 corner = vec2(float(gl_VertexID & 1), float(gl_VertexID >> 1));
  vec2 p = mix(u_rect.xy, u_rect.zw, corner);
  v_local = p - u_rect.xy;
  vec2 ndc = (p - u_display.xy) / u_display.zw * 2.0 - 1.0;
  gl_Position = vec4(ndc.x, -ndc.y, 0.0, 1.0);
}

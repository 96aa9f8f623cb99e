// Flat colour; ImGui's blending (source alpha over) stays on, so translucent columns look as ImGui drew them.
in vec4 v_color;
out vec4 frag_color;

void main() { frag_color = v_color; }

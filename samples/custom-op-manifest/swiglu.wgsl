// SwiGLU on the GPU: one invocation per element of y. Kiln appends the constants used
// here (y_shape, x_shape, beta, KILN_WORKGROUP, KILN_INVOCATIONS, kiln_index).
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(KILN_WORKGROUP)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = kiln_index(gid);
    if (i >= KILN_INVOCATIONS) {
        return;
    }
    let half = y_shape[1];
    let row = i / half;
    let col = i % half;
    let a = x[row * x_shape[1] + col];
    let b = x[row * x_shape[1] + half + col];
    y[i] = a / (1.0 + exp(-beta * a)) * b;
}

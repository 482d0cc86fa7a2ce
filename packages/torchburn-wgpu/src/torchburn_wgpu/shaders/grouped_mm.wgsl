// A mixture of experts' product (`_grouped_mm` with offsets): row s of `a` [S, K] times the matrix of
// its group in `b` [G, K, N], its group the first g with s < offs[g]; rows past the last offset are
// zero. One thread per element of `out` [S, N]: the experts' products are small next to a dense layer's,
// and a token's group is only known when the kernel runs.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<{{TYPE}}>;
@group(0) @binding(2) var<storage, read> a: array<{{TYPE}}>;
@group(0) @binding(3) var<storage, read> b: array<{{TYPE}}>;
@group(0) @binding(4) var<storage, read> offs: array<i32>;

// params: [rows, n, k, groups, a_offset, a_row_step, a_col_step, b_offset, b_group_step, b_row_step,
//          b_col_step, offs_offset, offs_step, out_offset, out_row_step, out_col_step]

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 256u;
    let rows = params[0];
    let n = params[1];
    if (i >= rows * n) {
        return;
    }
    let s = i / n;
    let j = i % n;
    var g = 0u;
    loop {
        if (g >= params[3] || i32(s) < offs[params[11] + g * params[12]]) {
            break;
        }
        g++;
    }
    var acc = 0.0;
    if (g < params[3]) {
        var pa = params[4] + s * params[5];
        var pb = params[7] + g * params[8] + j * params[10];
        for (var t = 0u; t < params[2]; t++) {
            acc += f32(a[pa]) * f32(b[pb]);
            pa += params[6];
            pb += params[9];
        }
    }
    out[params[13] + s * params[14] + j * params[15]] = {{TYPE}}(acc);
}

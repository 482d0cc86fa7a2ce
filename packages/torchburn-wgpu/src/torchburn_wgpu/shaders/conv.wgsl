// 2-d convolution (1-d runs as height 1) as an implicit GEMM: C[pixel, out channel] = A · B with
// A[pixel, (in channel, ky, kx)] gathered from the input on the fly (no im2col buffer) and B the
// weight. Tiled like matmul.wgsl: 128×128 outputs per workgroup, 8×8 per thread in named registers
// (written out by the kernel builder), 16-deep slabs of A and
// B staged in workgroup memory. One group of a grouped convolution per workgroup z.
// Transposed convolution uses the same tiles: an input pixel contributes where the strided output
// position lines up, so A's gather just tests divisibility.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

// params, by index
const P_M = 0u;          // batch * out_h * out_w
const P_COUT_G = 1u;     // output channels per group
const P_K = 2u;          // in channels per group * kh * kw
const P_CIN_G = 3u;
const P_H = 4u;
const P_W = 5u;
const P_OH = 6u;
const P_OW = 7u;
const P_KH = 8u;
const P_KW = 9u;
const P_SH = 10u;
const P_SW = 11u;
const P_PH = 12u;
const P_PW = 13u;
const P_DH = 14u;
const P_DW = 15u;
const P_X = 16u;         // offset, then strides n, c, h, w
const P_WT = 21u;        // offset, then strides of the weight's 4 dims
const P_BIAS = 26u;      // has_bias, offset, stride
const P_TRANSPOSED = 29u;
const P_COUT = 30u;      // all output channels
const P_K_CHUNK = 31u;   // split-k: how deep each slice is,
const P_SPLITS = 32u;    // and how many (each slice writes its own plane of partial outputs)

// [k][pixel / 4]: 16 rows of 32 vec4, each padded by one against bank conflicts (see matmul.wgsl)
const A_ROW: u32 = 33u;  // vec4 per staged row of A (32, padded by one) and of B (the register block reads them)
const B_ROW: u32 = 32u;
var<workgroup> a_tile: array<vec4<f32>, 16u * A_ROW>;
var<workgroup> b_tile: array<vec4<f32>, 16u * B_ROW>;  // [k][channel / 4]

fn load_a(m: u32, k: u32, g: u32) -> f32 {
    let ohw = params[P_OH] * params[P_OW];
    let n = m / ohw;
    let rem = m % ohw;
    let oy = i32(rem / params[P_OW]);
    let ox = i32(rem % params[P_OW]);
    let khw = params[P_KH] * params[P_KW];
    let ci = k / khw;
    let r = k % khw;
    let ky = i32(r / params[P_KW]);
    let kx = i32(r % params[P_KW]);
    var iy: i32;
    var ix: i32;
    if (params[P_TRANSPOSED] != 0u) {
        let ny = oy + i32(params[P_PH]) - ky * i32(params[P_DH]);
        let nx = ox + i32(params[P_PW]) - kx * i32(params[P_DW]);
        let sh = i32(params[P_SH]);
        let sw = i32(params[P_SW]);
        if (ny < 0 || nx < 0 || ny % sh != 0 || nx % sw != 0) {
            return 0.0;
        }
        iy = ny / sh;
        ix = nx / sw;
    } else {
        iy = oy * i32(params[P_SH]) - i32(params[P_PH]) + ky * i32(params[P_DH]);
        ix = ox * i32(params[P_SW]) - i32(params[P_PW]) + kx * i32(params[P_DW]);
    }
    if (iy < 0 || ix < 0 || iy >= i32(params[P_H]) || ix >= i32(params[P_W])) {
        return 0.0;
    }
    let c = g * params[P_CIN_G] + ci;
    return x[params[P_X] + n * params[P_X + 1u] + c * params[P_X + 2u] + u32(iy) * params[P_X + 3u]
             + u32(ix) * params[P_X + 4u]];
}

fn load_b(k: u32, co: u32, g: u32) -> f32 {
    let khw = params[P_KH] * params[P_KW];
    let ci = k / khw;
    let r = k % khw;
    let ky = r / params[P_KW];
    let kx = r % params[P_KW];
    // weight [C_out, C_in/g, kh, kw], or [C_in, C_out/g, kh, kw] when transposed
    var d0 = g * params[P_COUT_G] + co;
    var d1 = ci;
    if (params[P_TRANSPOSED] != 0u) {
        d0 = g * params[P_CIN_G] + ci;
        d1 = co;
    }
    return w[params[P_WT] + d0 * params[P_WT + 1u] + d1 * params[P_WT + 2u] + ky * params[P_WT + 3u]
             + kx * params[P_WT + 4u]];
}

fn put(m: u32, co: u32, g: u32, plane: u32, v: f32) {
    let N = params[P_COUT_G];
    if (m >= params[P_M] || co >= N) {
        return;
    }
    let ohw = params[P_OH] * params[P_OW];
    let n = m / ohw;
    let pixel = m % ohw;
    let channel = g * N + co;
    var out_v = v;
    if (params[P_BIAS] != 0u) {
        out_v += bias[params[P_BIAS + 1u] + channel * params[P_BIAS + 2u]];
    }
    let plane_size = (params[P_M] / ohw) * params[P_COUT] * ohw;
    out[plane * plane_size + (n * params[P_COUT] + channel) * ohw + pixel] = out_v;
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let M = params[P_M];
    let N = params[P_COUT_G];
    let splits = params[P_SPLITS];
    let g = wg.z / splits;
    let plane = wg.z % splits;
    let k_begin = plane * params[P_K_CHUNK];
    let K = min(params[P_K], k_begin + params[P_K_CHUNK]);
    let row0 = wg.y * 128u;
    let col0 = wg.x * 128u;
    let t = lid.y * 16u + lid.x;
{{ACC_DECLARE}}
    for (var k0 = k_begin; k0 < K; k0 += 16u) {
        for (var e = 0u; e < 8u; e++) {
            let idx = t + e * 256u;
            let am = idx / 16u;
            let ak = idx % 16u;
            var av = 0.0;
            if (row0 + am < M && k0 + ak < K) {
                av = load_a(row0 + am, k0 + ak, g);
            }
            a_tile[ak * A_ROW + am / 4u][am % 4u] = av;
            let bk = idx / 128u;
            let bn = idx % 128u;
            var bv = 0.0;
            if (k0 + bk < K && col0 + bn < N) {
                bv = load_b(k0 + bk, col0 + bn, g);
            }
            b_tile[bk * B_ROW + bn / 4u][bn % 4u] = bv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk++) {
{{ACC_UPDATE}}
        }
        workgroupBarrier();
    }
{{ACC_STORE}}
}

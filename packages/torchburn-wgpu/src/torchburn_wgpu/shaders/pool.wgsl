// 2-d max and average pooling (1-d runs as height 1): one thread per output element, the window read
// through the input's strides. Max pooling also writes each maximum's position in its input plane
// (y·W + x), as aten.max_pool2d_with_indices returns it, and lets NaN win as PyTorch does.

{{MATH}}

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read_write> indices: array<i32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;

const MAX: bool = {{MAX}};

// params, by index
const P_TOTAL = 0u;  // batch * channels * out_h * out_w
const P_C = 1u;
const P_H = 2u;
const P_W = 3u;
const P_OH = 4u;
const P_OW = 5u;
const P_KH = 6u;
const P_KW = 7u;
const P_SH = 8u;
const P_SW = 9u;
const P_PH = 10u;
const P_PW = 11u;
const P_DH = 12u;
const P_DW = 13u;
const P_X = 14u;  // offset, strides n, c, h, w
const P_COUNT_PAD = 19u;
const P_DIVISOR = 20u;  // 0: none

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 256u;
    if (i >= params[P_TOTAL]) {
        return;
    }
    let ow = i32(i % params[P_OW]);
    let oh = i32((i / params[P_OW]) % params[P_OH]);
    let nc = i / (params[P_OW] * params[P_OH]);
    let c = nc % params[P_C];
    let n = nc / params[P_C];
    let H = i32(params[P_H]);
    let W = i32(params[P_W]);
    let base = params[P_X] + n * params[P_X + 1u] + c * params[P_X + 2u];
    let y0 = oh * i32(params[P_SH]) - i32(params[P_PH]);
    let x0 = ow * i32(params[P_SW]) - i32(params[P_PW]);
    if (MAX) {
        var best = -bitcast<f32>(0x7f800000u);
        var best_at = -1;
        for (var ky = 0; ky < i32(params[P_KH]); ky++) {
            let y = y0 + ky * i32(params[P_DH]);
            if (y < 0 || y >= H) {
                continue;
            }
            for (var kx = 0; kx < i32(params[P_KW]); kx++) {
                let xx = x0 + kx * i32(params[P_DW]);
                if (xx < 0 || xx >= W) {
                    continue;
                }
                let v = x[base + u32(y) * params[P_X + 3u] + u32(xx) * params[P_X + 4u]];
                if (best_at < 0 || v > best || (tb_isnan(v) && !tb_isnan(best))) {
                    best = v;
                    best_at = y * W + xx;
                }
            }
        }
        out[i] = best;
        indices[i] = best_at;
        return;
    }
    // average, with PyTorch's divisor: the window clipped to the padded input, or to the input
    var y1 = min(y0 + i32(params[P_KH]), H + i32(params[P_PH]));
    var x1 = min(x0 + i32(params[P_KW]), W + i32(params[P_PW]));
    let padded = (y1 - y0) * (x1 - x0);
    let ys = max(y0, 0);
    let xs = max(x0, 0);
    y1 = min(y1, H);
    x1 = min(x1, W);
    var total = 0.0;
    for (var y = ys; y < y1; y++) {
        for (var xx = xs; xx < x1; xx++) {
            total += x[base + u32(y) * params[P_X + 3u] + u32(xx) * params[P_X + 4u]];
        }
    }
    var divisor = f32((y1 - ys) * (x1 - xs));
    if (params[P_COUNT_PAD] != 0u) {
        divisor = f32(padded);
    }
    if (params[P_DIVISOR] != 0u) {
        divisor = f32(params[P_DIVISOR]);
    }
    out[i] = total / divisor;
}

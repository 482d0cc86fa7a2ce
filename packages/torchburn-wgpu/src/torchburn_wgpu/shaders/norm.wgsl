// Layer norm over the trailing `length` elements of each row of a contiguous tensor: one workgroup per
// row; mean and variance in two passes (no cancellation from E[x²] - E[x]²), then the affine write.
// Also writes each row's mean and 1/std, as aten.native_layer_norm returns them.
//
// params: [rows, length, eps_bits, has_weight, has_bias]

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read_write> mean_out: array<f32>;
@group(0) @binding(3) var<storage, read_write> rstd_out: array<f32>;
@group(0) @binding(4) var<storage, read> x: array<f32>;
@group(0) @binding(5) var<storage, read> weight: array<f32>;
@group(0) @binding(6) var<storage, read> bias: array<f32>;

{{ROW_TREE}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32{{LANE_ARGS}}) {
{{LANE_INIT}}
    let row = wg.x + wg.y * groups.x;
    if (row >= params[0]) {
        return;
    }
    let n = params[1];
    let base = row * n;
    var s = 0.0;
    for (var j = lid; j < n; j += 256u) {
        s += x[base + j];
    }
    let mean = fold_sum(lid, s) / f32(n);
    var q = 0.0;
    for (var j = lid; j < n; j += 256u) {
        let d = x[base + j] - mean;
        q += d * d;
    }
    let rstd = inverseSqrt(fold_sum(lid, q) / f32(n) + bitcast<f32>(params[2]));
    for (var j = lid; j < n; j += 256u) {
        var v = (x[base + j] - mean) * rstd;
        if (params[3] != 0u) {
            v *= weight[j];
        }
        if (params[4] != 0u) {
            v += bias[j];
        }
        out[base + j] = v;
    }
    if (lid == 0u) {
        mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}

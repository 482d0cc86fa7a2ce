// Softmax (or log-softmax) along one dim of a strided tensor: one workgroup per row, three passes
// over the row (max, sum of exponentials, write) with workgroup-wide folds (`fold_max`, `fold_sum`) in
// between. Rows of up
// to 4096 elements are read once into registers (named, written out by the kernel builder) instead.
//
// params: [rows, length, offset, dim_stride, out_dim_stride, outer_shape[OUTER_RANK],
//        outer_strides[OUTER_RANK], out_outer_strides[OUTER_RANK]]
// (the input is read through its strides; the output is contiguous, whichever dim is reduced)

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;

const OUTER_RANK: u32 = {{OUTER_RANK}}u;
const LOG: bool = {{LOG}};
const IN_REGISTERS: bool = {{IN_REGISTERS}};

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
    let stride = params[3];
    let out_stride = params[4];
    var base = params[2];
    var out_base = 0u;
    var rest = row;
    for (var d = OUTER_RANK; d > 0u; d--) {
        let size = params[5u + d - 1u];
        let idx = rest % size;
        base += idx * params[5u + OUTER_RANK + d - 1u];
        out_base += idx * params[5u + 2u * OUTER_RANK + d - 1u];
        rest /= size;
    }
    if (IN_REGISTERS) {
        // the row fits 256 threads × a few registers: read it once, keep it, write it once
{{IN_REGISTERS_BODY}}
        return;
    }
    var m = -3.4028235e38;
    var saw_nan = false;
    for (var j = lid; j < n; j += 256u) {
        let v = x[base + j * stride];
        saw_nan = saw_nan || ((bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u);
        m = max(m, v);
    }
    // a NaN anywhere makes the row's max +inf, so that every output of the row comes out NaN (max()
    // of a NaN is not defined in WGSL; +inf is an ordinary value to it)
    let row_max = fold_max(lid, select(m, bitcast<f32>(0x7f800000u), saw_nan));
    var s = 0.0;
    for (var j = lid; j < n; j += 256u) {
        s += exp(x[base + j * stride] - row_max);
    }
    let total = fold_sum(lid, s);
    let log_total = log(total);
    for (var j = lid; j < n; j += 256u) {
        let shifted = x[base + j * stride] - row_max;
        out[out_base + j * out_stride] = select(exp(shifted) / total, shifted - log_total, LOG);
    }
}

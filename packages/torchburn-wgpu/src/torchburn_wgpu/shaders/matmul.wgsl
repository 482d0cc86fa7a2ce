// Batched matrix multiply C[b] = alpha * A[b] @ B[b] (+ beta * bias), in f32 (or f64 where the adapter
// has it), every operand by its own strides (a transposed weight or a permuted activation needs no copy).
//
// Tiled: a workgroup of 16×16 threads computes a 64×64 tile of C, each thread a 4×4 block held in
// registers; per step along k it stages a 64×16 slab of A and a 16×64 slab of B in workgroup memory,
// so each element loaded from memory is used 64 times.
//
// params: [M, N, K, a_off, a_bs, a_rs, a_cs, b_off, b_bs, b_rs, b_cs,
//        bias_off, bias_bs, bias_rs, bias_cs, has_bias, alpha_bits, beta_bits, a_bdiv, b_bdiv, bias_bdiv]
// (x_bdiv: the batch index of operand x is b / x_bdiv, for batch broadcasting; 0 stride also works)

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> c: array<{{TYPE}}>;
@group(0) @binding(2) var<storage, read> a: array<{{TYPE}}>;
@group(0) @binding(3) var<storage, read> b: array<{{TYPE}}>;
@group(0) @binding(4) var<storage, read> bias: array<{{TYPE}}>;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

var<workgroup> a_tile: array<array<{{TYPE}}, 65>, 16>;  // [k][m], padded against bank conflicts
var<workgroup> b_tile: array<array<{{TYPE}}, 64>, 16>;  // [k][n]

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let M = params[0];
    let N = params[1];
    let K = params[2];
    let batch = wg.z;
    let a_base = params[3] + batch * params[4];
    let b_base = params[7] + batch * params[8];
    let row0 = wg.y * TM;
    let col0 = wg.x * TN;
    let t = lid.y * 16u + lid.x;  // 0..255
    var acc: array<array<{{TYPE}}, 4>, 4>;
    for (var k0 = 0u; k0 < K; k0 += TK) {
        // 256 threads stage 64×16 of A and 16×64 of B: four elements each
        for (var e = 0u; e < 4u; e++) {
            let idx = t + e * 256u;
            let am = idx / TK;
            let ak = idx % TK;
            let gm = row0 + am;
            let gk = k0 + ak;
            var av = {{TYPE}}(0);
            if (gm < M && gk < K) {
                av = a[a_base + gm * params[5] + gk * params[6]];
            }
            a_tile[ak][am] = av;
            let bk = idx / TN;
            let bn = idx % TN;
            let gk2 = k0 + bk;
            let gn = col0 + bn;
            var bv = {{TYPE}}(0);
            if (gk2 < K && gn < N) {
                bv = b[b_base + gk2 * params[9] + gn * params[10]];
            }
            b_tile[bk][bn] = bv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            var av: array<{{TYPE}}, 4>;
            var bv: array<{{TYPE}}, 4>;
            for (var i = 0u; i < 4u; i++) {
                av[i] = a_tile[kk][lid.y + i * 16u];
                bv[i] = b_tile[kk][lid.x + i * 16u];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i][j] = fma(av[i], bv[j], acc[i][j]);
                }
            }
        }
        workgroupBarrier();
    }
    let alpha = {{TYPE}}(bitcast<f32>(params[16]));
    let beta = {{TYPE}}(bitcast<f32>(params[17]));
    let has_bias = params[15] != 0u;
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + lid.y + i * 16u;
        if (r >= M) {
            continue;
        }
        for (var j = 0u; j < 4u; j++) {
            let col = col0 + lid.x + j * 16u;
            if (col >= N) {
                continue;
            }
            var v = alpha * acc[i][j];
            if (has_bias) {
                v += beta * bias[params[11] + batch * params[12] + r * params[13] + col * params[14]];
            }
            c[batch * M * N + r * N + col] = v;
        }
    }
}

// Batched matrix multiply C[b] = alpha * A[b] @ B[b] (+ beta * bias), stored as TYPE and computed in ACC
// (f32; f64 where the adapter has it; f16 stored, f32 accumulated, where it has shader-f16), every operand by its own strides (a transposed weight or a permuted activation needs no copy).
//
// Tiled for register reuse: a workgroup of 16×16 threads computes a TILE×TILE tile of C (128, or 64
// for products with too few 128-tiles to fill the GPU), each thread an 8×8 (4×4) block held in named
// registers (the kernel builder writes the unrolled products and stores:
// GPU compilers put an indexed array in slow local memory instead). Per step along k it stages a 16-deep slab of A (transposed, so a thread
// reads its 8 rows as two vec4) and of B in workgroup memory; each element loaded from memory is then
// used 128 times, and each shared-memory vec4 read feeds 16 multiply-adds.
//
// params: [M, N, K, a_off, a_bs, a_rs, a_cs, b_off, b_bs, b_rs, b_cs,
//          bias_off, bias_bs, bias_rs, bias_cs, has_bias, alpha_bits, beta_bits, k_chunk, splits]
//
// Split-k: where the output has too few tiles to fill the GPU (a long k, a small C), workgroup z
// covers (batch, slice) and each slice of k writes its partial C to its own plane; the sum (with
// alpha and the bias) is then one fused elementwise kernel.

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> c: array<{{TYPE}}>;
@group(0) @binding(2) var<storage, read> a: array<{{TYPE}}>;
@group(0) @binding(3) var<storage, read> b: array<{{TYPE}}>;
@group(0) @binding(4) var<storage, read> bias: array<{{TYPE}}>;
// the same buffers as a and b, read four elements at a time where they are contiguous and aligned
@group(0) @binding(5) var<storage, read> a4: array<vec4<{{TYPE}}>>;
@group(0) @binding(6) var<storage, read> b4: array<vec4<{{TYPE}}>>;

// how the tiles are staged (fixed per pipeline by the operands' layouts): A_VEC, A row-major and
// aligned, read as vec4 along k; B_MODE 1: B row-major and aligned, vec4 along n; 2: B contiguous
// along k and aligned, vec4 along k; 0: element by element through the strides
const A_VEC: bool = {{A_VEC}};
const B_MODE: u32 = {{B_MODE}}u;

const TM: u32 = {{TILE}}u;
const TN: u32 = {{TILE}}u;
const TK: u32 = 16u;
// vec4 per staged row of A (padded by one) and of B
const A_ROW: u32 = TM / 4u + 1u;
const B_ROW: u32 = TN / 4u;
// staging work per thread: vec4 loads, or single elements, of each tile
const A_VEC_LOADS: u32 = TM * TK / 1024u;
const B_VEC_LOADS: u32 = TN * TK / 1024u;
const A_LOADS: u32 = TM * TK / 256u;
const B_LOADS: u32 = TN * TK / 256u;

// [k][m / 4]: 16 rows of TM/4 vec4, each padded by one: the staging writes of one warp run down a
// column (16 values of k), which unpadded would all fall in the same memory bank
var<workgroup> a_tile: array<vec4<{{ACC}}>, TK * A_ROW>;
var<workgroup> b_tile: array<vec4<{{ACC}}>, TK * B_ROW>;  // [k][n / 4]

fn put(r: u32, col: u32, plane: u32, batch: u32, v: {{ACC}}, alpha: {{ACC}}, beta: {{ACC}}) {
    let M = params[0];
    let N = params[1];
    if (r >= M || col >= N) {
        return;
    }
    var out = alpha * v;
    if (params[15] != 0u) {
        out += beta * {{ACC}}(bias[params[11] + batch * params[12] + r * params[13] + col * params[14]]);
    }
    c[plane * M * N + r * N + col] = {{TYPE}}(out);
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let M = params[0];
    let N = params[1];
    let splits = params[19];
    let batch = wg.z / splits;
    let k_begin = (wg.z % splits) * params[18];
    let K = min(params[2], k_begin + params[18]);
    let a_base = params[3] + batch * params[4];
    let b_base = params[7] + batch * params[8];
    let a_rs = params[5];
    let a_cs = params[6];
    let b_rs = params[9];
    let b_cs = params[10];
    let row0 = wg.y * TM;
    let col0 = wg.x * TN;
    let t = lid.y * 16u + lid.x;  // 0..255
{{ACC_DECLARE}}
    for (var k0 = k_begin; k0 < K; k0 += TK) {
        // stage 128×16 of A and 16×128 of B; consecutive threads read consecutive addresses in
        // whichever direction the operand is contiguous, four at a time where it is aligned
        if (A_VEC) {
            // row-major A: vec4 along k (two per thread at 128), four threads per row
            for (var e = 0u; e < A_VEC_LOADS; e++) {
                let v = t + e * 256u;
                let am = v / 4u;
                let ak = (v % 4u) * 4u;
                var av = vec4<{{ACC}}>();
                if (row0 + am < M && k0 + ak < K) {
                    av = vec4<{{ACC}}>(a4[(a_base + (row0 + am) * a_rs + k0 + ak) / 4u]);
                }
                a_tile[(ak + 0u) * A_ROW + am / 4u][am % 4u] = av.x;
                a_tile[(ak + 1u) * A_ROW + am / 4u][am % 4u] = av.y;
                a_tile[(ak + 2u) * A_ROW + am / 4u][am % 4u] = av.z;
                a_tile[(ak + 3u) * A_ROW + am / 4u][am % 4u] = av.w;
            }
        } else {
            // eight (four) elements per thread, consecutive threads on consecutive k
            for (var e = 0u; e < A_LOADS; e++) {
                let idx = t + e * 256u;
                let am = idx / TK;
                let ak = idx % TK;
                var av = {{ACC}}(0);
                if (row0 + am < M && k0 + ak < K) {
                    av = {{ACC}}(a[a_base + (row0 + am) * a_rs + (k0 + ak) * a_cs]);
                }
                a_tile[ak * A_ROW + am / 4u][am % 4u] = av;
            }
        }
        if (B_MODE == 1u) {
            // row-major B: vec4 along n
            for (var e = 0u; e < B_VEC_LOADS; e++) {
                let v = t + e * 256u;
                let bk = v / B_ROW;
                let bn = (v % B_ROW) * 4u;
                var bv = vec4<{{ACC}}>();
                if (k0 + bk < K && col0 + bn < N) {
                    bv = vec4<{{ACC}}>(b4[(b_base + (k0 + bk) * b_rs + col0 + bn) / 4u]);
                }
                b_tile[bk * B_ROW + bn / 4u] = bv;
            }
        } else if (B_MODE == 2u) {
            // B contiguous along k (a Linear weight read as w.t(), keys in q·kᵀ): vec4 along k,
            // four threads per column
            for (var e = 0u; e < B_VEC_LOADS; e++) {
                let v = t + e * 256u;
                let bn = v / 4u;
                let bk = (v % 4u) * 4u;
                var bv = vec4<{{ACC}}>();
                if (col0 + bn < N && k0 + bk < K) {
                    bv = vec4<{{ACC}}>(b4[(b_base + (col0 + bn) * b_cs + k0 + bk) / 4u]);
                }
                b_tile[(bk + 0u) * B_ROW + bn / 4u][bn % 4u] = bv.x;
                b_tile[(bk + 1u) * B_ROW + bn / 4u][bn % 4u] = bv.y;
                b_tile[(bk + 2u) * B_ROW + bn / 4u][bn % 4u] = bv.z;
                b_tile[(bk + 3u) * B_ROW + bn / 4u][bn % 4u] = bv.w;
            }
        } else {
            // eight (four) elements per thread, consecutive threads on consecutive n
            for (var e = 0u; e < B_LOADS; e++) {
                let idx = t + e * 256u;
                let bk = idx / TN;
                let bn = idx % TN;
                var bv = {{ACC}}(0);
                if (k0 + bk < K && col0 + bn < N) {
                    bv = {{ACC}}(b[b_base + (k0 + bk) * b_rs + (col0 + bn) * b_cs]);
                }
                b_tile[bk * B_ROW + bn / 4u][bn % 4u] = bv;
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
{{ACC_UPDATE}}
        }
        workgroupBarrier();
    }
    let alpha = {{ACC}}(bitcast<f32>(params[16]));
    let beta = {{ACC}}(bitcast<f32>(params[17]));
{{ACC_STORE}}
}

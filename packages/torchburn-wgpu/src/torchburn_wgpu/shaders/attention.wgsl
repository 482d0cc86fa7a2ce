// Fused scaled-dot-product attention, as aten._scaled_dot_product_flash_attention_for_cpu computes it:
// one workgroup per query row; keys in chunks whose scores sit in workgroup memory, folded into a
// running max, sum and output (online softmax), so any number of keys fits and nothing of size
// L × S ever reaches memory.
// - scores are scale · q·k, plus an additive float mask, or -inf where a bool mask is false;
// - causal is PyTorch's is_causal: query i sees keys j <= i (top-left aligned), with any mask;
// - a row whose every key is masked gives zeros and a log-sum-exp of 0, as PyTorch's does;
// - NaN in q, k, v or the mask propagates to the row.
//
// - grouped-query attention: k and v have H / group heads; query head h reads head h / group.
//
// params: [B, H, L, S, E, EV, causal, has_mask, scale_bits,
//          q_off, q strides[4], k_off, k strides[4], v_off, v strides[4], m_off, m strides[4], group]

{{MATH}}

@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read_write> lse: array<f32>;
@group(0) @binding(3) var<storage, read> q: array<f32>;
@group(0) @binding(4) var<storage, read> k: array<f32>;
@group(0) @binding(5) var<storage, read> v: array<f32>;
@group(0) @binding(6) var<storage, read> mask: array<{{MASK_TYPE}}>;

const MASK_BOOL: bool = {{MASK_BOOL}};
const WG: u32 = 128u;
const CHUNK: u32 = 1024u;  // keys whose scores are held at once
const MAX_E: u32 = 256u;   // head size of q/k; of v, at most 2 × WG

var<workgroup> q_row: array<f32, 256>;
var<workgroup> scores: array<f32, 1024>;
var<workgroup> red: array<f32, 128>;

fn reduce(lid: u32, value: f32, is_max: bool) -> f32 {
    red[lid] = value;
    workgroupBarrier();
    for (var width = WG / 2u; width > 0u; width >>= 1u) {
        if (lid < width) {
            red[lid] = select(red[lid] + red[lid + width], tb_max(red[lid], red[lid + width]), is_max);
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

fn at(base: u32, b: u32, h: u32, i: u32, j: u32) -> u32 {
    return params[base] + b * params[base + 1u] + h * params[base + 2u] + i * params[base + 3u]
           + j * params[base + 4u];
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let B = params[0];
    let H = params[1];
    let L = params[2];
    let S = params[3];
    let E = params[4];
    let EV = params[5];
    let causal = params[6] != 0u;
    let has_mask = params[7] != 0u;
    let scale = bitcast<f32>(params[8]);
    let row = wg.x + wg.y * groups.x;
    if (row >= B * H * L) {
        return;
    }
    let i = row % L;
    let h = (row / L) % H;
    let b = row / (L * H);
    let kh = h / params[29u];  // the key/value head this query head reads
    for (var e = lid; e < E; e += WG) {
        q_row[e] = q[at(9u, b, h, i, e)];
    }
    workgroupBarrier();
    let neg_inf = -bitcast<f32>(0x7f800000u);
    var m = neg_inf;
    var total = 0.0;
    var acc0 = 0.0;
    var acc1 = 0.0;
    for (var j0 = 0u; j0 < S; j0 += CHUNK) {
        let n = min(CHUNK, S - j0);
        var local_max = neg_inf;
        for (var jj = lid; jj < n; jj += WG) {
            let j = j0 + jj;
            var dot = 0.0;
            for (var e = 0u; e < E; e++) {
                dot = fma(q_row[e], k[at(14u, b, kh, j, e)], dot);
            }
            var s = scale * dot;
            if (has_mask) {
                let mv = mask[at(24u, b, h, i, j)];
                if (MASK_BOOL) {
                    s = select(neg_inf, s, f32(mv) != 0.0);
                } else {
                    s += f32(mv);
                }
            }
            if (causal && j > i) {
                s = neg_inf;
            }
            scores[jj] = s;
            local_max = tb_max(local_max, s);
        }
        let m_new = tb_max(m, reduce(lid, local_max, true));
        // nothing seen but masked keys so far: nothing to rescale
        let alpha = select(exp(m - m_new), 1.0, m_new == neg_inf);
        var local_sum = 0.0;
        for (var jj = lid; jj < n; jj += WG) {
            let p = select(exp(scores[jj] - m_new), 0.0, m_new == neg_inf);
            scores[jj] = p;
            local_sum += p;
        }
        total = total * alpha + reduce(lid, local_sum, false);
        acc0 *= alpha;
        acc1 *= alpha;
        for (var jj = 0u; jj < n; jj++) {
            let p = scores[jj];
            if (lid < EV) {
                acc0 = fma(p, v[at(19u, b, kh, j0 + jj, lid)], acc0);
            }
            if (lid + WG < EV) {
                acc1 = fma(p, v[at(19u, b, kh, j0 + jj, lid + WG)], acc1);
            }
        }
        m = m_new;
        workgroupBarrier();  // the next chunk's scores overwrite these
    }
    let empty = m == neg_inf;  // every key masked: zeros, log-sum-exp 0
    let o = row * EV;
    if (lid < EV) {
        out[o + lid] = select(acc0 / total, 0.0, empty);
    }
    if (lid + WG < EV) {
        out[o + lid + WG] = select(acc1 / total, 0.0, empty);
    }
    if (lid == 0u) {
        lse[row] = select(m + log(total), 0.0, empty);
    }
}

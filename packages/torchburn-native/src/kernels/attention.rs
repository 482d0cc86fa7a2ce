pub struct SdpaShape {
    pub b: usize,
    pub h: usize,
    pub tq: usize,
    pub tk: usize,
    pub d: usize,
    pub dv: usize,
}
pub enum AttnMask<'a> {
    Additive {
        data: &'a [f32],
        strides: [usize; 4],
    },
    Keep {
        data: &'a [u8],
        strides: [usize; 4],
    },
}
#[allow(clippy::too_many_arguments)]
pub fn sdpa_f32(
    _s: &SdpaShape,
    _q: &[f32],
    _k: &[f32],
    _v: &[f32],
    _m: Option<AttnMask<'_>>,
    _c: bool,
    _sc: f32,
    _o: &mut [f32],
    _l: Option<&mut [f32]>,
) {
    unimplemented!()
}

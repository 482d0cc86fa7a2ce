//! Operands: typed, strided views of a region input, a region output or the scratch arena.

use serde::Deserialize;

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F64,
    F16,
    Bf16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::Bf16 | DType::I16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }
}

/// Where an operand's memory lives: a region input, a region output, or the scratch arena (byte offset).
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    In(usize),
    Out(usize),
    Tmp(usize),
}

/// A strided view: element offset, sizes and element strides (0 for a broadcast dimension).
#[derive(Deserialize, Clone, Debug)]
pub struct Operand {
    pub buf: Buf,
    pub dtype: DType,
    #[serde(default)]
    pub offset: isize,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
}

impl Operand {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true; // nothing to lay out
        }
        let mut expected = 1isize;
        for (&size, &stride) in self.shape.iter().zip(&self.strides).rev() {
            if size != 1 && stride != expected {
                return false;
            }
            expected *= size as isize;
        }
        true
    }
}

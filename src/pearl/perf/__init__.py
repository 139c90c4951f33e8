"""The performance model: hardware and model catalogues, roofline step times, calibration against
measured steps, and saved profiles. Pure computation; nothing here owns time or devices."""
from pearl.perf.calibrate import Calibration, StepSample, calibrate, fit
from pearl.perf.hardware import HARDWARE, Hardware, get_hardware
from pearl.perf.models import MODELS, ModelShape, get_model, model_from_hf_config
from pearl.perf.profile import PROFILE_VERSION, Profile, load_profile, save_profile
from pearl.perf.roofline import PerfCoeffs, PerfModel

__all__ = [
    "HARDWARE", "MODELS", "PROFILE_VERSION", "Calibration", "Hardware", "ModelShape",
    "PerfCoeffs", "PerfModel", "Profile", "StepSample", "calibrate", "fit", "get_hardware", "get_model",
    "load_profile", "model_from_hf_config", "save_profile",
]

"""xcal study (paper 001): XCal-FL, federated classification with Grad-CAM-calibrated DP."""

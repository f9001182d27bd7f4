from verifier_svc.main import main

main()

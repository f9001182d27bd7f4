from drafter_svc.main import main

main()
